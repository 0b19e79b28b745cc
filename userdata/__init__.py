"""The jinja2 templates of the boot scripts, shipped inside the wheel as package data."""
