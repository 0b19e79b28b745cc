"""The shape of the house: constructs/ is not a package, and lower layers never import higher."""

import ast
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "constructs" / "neuron_serving"


def _imports(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            prefix = "." * node.level
            names.add(prefix + (node.module or ""))
    return names


def _python_files():
    for folder in ("constructs", "tests", "userdata"):
        yield from (ROOT / folder).rglob("*.py")
    yield ROOT / "app.py"


def test_constructs_folder_has_no_init_so_it_cannot_shadow_the_constructs_package():
    assert not (ROOT / "constructs" / "__init__.py").exists()


def test_import_constructs_resolves_to_the_installed_package_from_the_repository_root():
    result = subprocess.run(
        [sys.executable, "-c", "import constructs, neuron_serving; print(constructs.__file__); "
         "print(neuron_serving.__file__); print(hasattr(constructs, 'Construct'))"],
        cwd=ROOT, capture_output=True, text=True, check=True,
    )
    constructs_file, package_file, has_construct = result.stdout.splitlines()
    assert "site-packages" in constructs_file
    assert Path(package_file).parent == PACKAGE
    assert has_construct == "True"


def test_nothing_imports_constructs_dot_neuron_serving():
    offenders = [
        str(path.relative_to(ROOT))
        for path in _python_files()
        if any(name.startswith("constructs.neuron_serving") for name in _imports(path))
    ]
    assert offenders == []


def test_plan_render_and_settings_layers_import_nothing_from_cdk():
    # Settings are read and checked (by preflight, too) without loading aws-cdk-lib.
    for layer in ("plan", "render", "settings"):
        for path in (PACKAGE / layer).glob("*.py"):
            imported = _imports(path)
            assert not any(name.startswith(("aws_cdk", "constructs", "cdk_nag", "jsii")) for name in imported), path
            assert not any(name.startswith(("..cdk", "..settings")) for name in imported), path


def test_plan_layer_does_not_import_render():
    for path in (PACKAGE / "plan").glob("*.py"):
        assert not any(name.startswith("..render") for name in _imports(path)), path


def test_templates_ship_inside_the_wheel(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    # The boot's steps are fragments in userdata/boot/, which boot-steps.sh.j2 includes.
    templates = {p.relative_to(ROOT / "userdata").as_posix() for p in (ROOT / "userdata").rglob("*.j2")}
    assert "boot-steps.sh.j2" in templates and "boot/pull-image.sh.j2" in templates
    assert {n.removeprefix("neuron_serving/userdata/") for n in names if n.startswith("neuron_serving/userdata/")} \
        >= templates
    assert "neuron_serving/py.typed" in names
    assert "neuron_serving/ops/aws.py" in names
    assert {"neuron_serving/ops/bench_tokenizer/tokenizer.json",
            "neuron_serving/ops/bench_tokenizer/tokenizer_config.json"} <= set(names)


def test_only_the_cli_and_its_ops_layer_import_boto3_rich_or_ops():
    # A CDK app that imports the constructs needs neither boto3 nor rich; the api-key commands and
    # neuron_serving.ops import them only where a command runs.
    operator = ("boto3", "botocore", "rich", ".ops", "..ops")
    for layer in ("plan", "render", "cdk", "settings"):
        for path in (PACKAGE / layer).rglob("*.py"):
            assert not any(name.startswith(operator) for name in _imports(path)), path
    assert not any(n.startswith(operator) for n in _imports(PACKAGE / "__init__.py"))


def test_only_the_ops_layer_asks_the_hub():
    # The plan layer reads the Hub cache's registry as plain values; synthesizing a stack never reaches the Hub.
    hub = ("huggingface_hub", "requests")
    for layer in ("plan", "render", "cdk", "settings"):
        for path in (PACKAGE / layer).rglob("*.py"):
            assert not any(name.startswith(hub) for name in _imports(path)), path
    importers = {path.relative_to(PACKAGE).as_posix() for path in PACKAGE.rglob("*.py")
                 if any(name.startswith(hub) for name in _imports(path))}
    assert importers == {"ops/hub_cache.py"}


def test_every_package_of_the_library_is_in_the_wheel(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    packages = {str(p.parent.relative_to(PACKAGE.parent)) for p in PACKAGE.rglob("__init__.py")}
    assert packages and {p for p in packages if f"{p}/__init__.py" not in names} == set()


def test_the_cli_commands_in_ops_use_only_the_pure_layers_and_only_the_cli_imports_them():
    pure = {"plan", "settings", "render", "userdata"}
    for path in (PACKAGE / "ops").glob("*.py"):
        upward = {name for name in _imports(path) if name.startswith("..")}
        assert {name[2:].split(".")[0] for name in upward} <= pure, path
        assert not any(name.startswith("neuron_serving.") for name in _imports(path)), path
    importers = [path for path in (*PACKAGE.rglob("*.py"), *(ROOT / "userdata").rglob("*.py"))
                 if PACKAGE / "ops" not in path.parents and path != PACKAGE / "cli.py"
                 and any(name.startswith((".ops", "..ops", "neuron_serving.ops")) for name in _imports(path))]
    assert importers == []
