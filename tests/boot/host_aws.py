#!/usr/bin/env -S python3 -S -B
"""A simulated host's ``aws``: records the call in the host's calls log, then runs the REAL AWS CLI v2.

The CLI is AWS CLI v2 2.36.7 (the wheel in ``../shared/awscli-v2/``), run by the fork server of
``tests/harness/awscli_fork.py`` (``$AWSCLI_FORK_SOCKET``) with this process's argv, environment,
directory and standard streams, against the test's moto and recorder (``tests/harness/aws.py``).

Imitated, and only when a test asks for it (the tests of a CLI too old for S3's conditional writes; AWS
CLI 1.34.1 and 2.9.19 are not installable here): ``$STUB_AWS_VERSION`` (the CLI the image came with) or,
for a CLI that AWS's installer put in ``$NEURON_SERVING_ROOT/usr/local/bin`` (stubs/curl links this
file there), ``$STUB_INSTALLED_AWS_VERSION`` is the line ``aws --version`` prints. A CLI older than
1.34.2 or 2.17.34 (S3 conditional writes, aws/aws-cli CHANGELOG.rst) has no IfNoneMatch in
``s3api put-object --generate-cli-skeleton`` (the real skeleton, without it) and rejects ``put-object
--if-none-match`` as an unknown option: "Unknown options" (awscli/clidriver.py), exit 255 in 1.34.1
(tried; CLIDriver.main) and 252 in 2.9.19 (awscli/errorhandler.py, PARAM_VALIDATION_ERROR_RC); the usage
text before it is abbreviated, the last line is 1.34.1's. Every other call of such a CLI is the real
v2's.
"""

import json
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent / "stubs"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "harness"))
from _stub import record
from awscli_fork import call

argv = record()
socket_path = os.environ["AWSCLI_FORK_SOCKET"]

root = os.environ.get("NEURON_SERVING_ROOT", "")
installed = bool(root) and Path(sys.argv[0]).parent == Path(root) / "usr" / "local" / "bin"
old = os.environ.get("STUB_INSTALLED_AWS_VERSION" if installed else "STUB_AWS_VERSION", "")
if not old:
    sys.exit(call(socket_path, argv))

version = tuple(int(n) for n in old.split()[0].removeprefix("aws-cli/").split("."))
conditional_writes = version >= ((1, 34, 2) if version[0] == 1 else (2, 17, 34))
if argv == ["--version"]:
    print(old)
    sys.exit(0)
if argv == ["s3api", "put-object", "--generate-cli-skeleton"] and not conditional_writes:
    saved = os.dup(1)
    with tempfile.TemporaryFile() as out:
        os.dup2(out.fileno(), 1)
        rc = call(socket_path, argv)
        os.dup2(saved, 1)
        out.seek(0)
        skeleton = json.loads(out.read())
    skeleton.pop("IfNoneMatch", None)
    print(json.dumps(skeleton, indent=4))
    sys.exit(rc)
if "--if-none-match" in argv and not conditional_writes:
    value = argv[argv.index("--if-none-match") + 1] if argv.index("--if-none-match") + 1 < len(argv) else ""
    print("\nusage: aws [options] <command> <subcommand> [<subcommand> ...] [parameters]\n"
          f"Unknown options: --if-none-match, {value}", file=sys.stderr)
    sys.exit(255 if version[0] == 1 else 252)
sys.exit(call(socket_path, argv))
