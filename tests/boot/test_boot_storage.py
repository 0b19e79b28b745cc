"""trn1's NVMe instance store as the exports' file system (issue 26): the storage step finds the drives by
their model name, stripes several into one RAID 0 array, makes one ext4 file system on it, mounts it where
the exports live and keeps it in fstab; a warm pool's host, which is stopped, and an inf2 host, which has
none, keep the exports on the root volume. mdadm, mkfs.ext4, mount and mountpoint are stubs that record
(tests/boot/stubs): this machine has no instance store."""

from __future__ import annotations

from collections.abc import Callable

from bootsim import HOOK, SIGNAL, Host, make_plan

from neuron_serving.render.boot_options import BootOptions
from tests.harness.userdata import boot_of

MakeHost = Callable[..., Host]
MODEL = "NousResearch/Meta-Llama-3-8B-Instruct"


def _drives(host: Host, count: int) -> list[str]:
    """Instance store drives as udev links them: a by-id link per drive (and one per partition, ignored)."""
    by_id = host.path("/dev/disk/by-id")
    by_id.mkdir(parents=True)
    drives = []
    for n in range(1, count + 1):
        drive = host.path(f"/dev/nvme{n}n1")
        drive.touch()
        (by_id / f"nvme-Amazon_EC2_NVMe_Instance_Storage_AWS{n:017d}").symlink_to(drive)
        (by_id / f"nvme-Amazon_EC2_NVMe_Instance_Storage_AWS{n:017d}-part1").symlink_to(drive)
        drives.append(str(drive))
    # The root volume is EBS: its link names another model.
    root = host.path("/dev/nvme0n1")
    root.touch()
    (by_id / "nvme-Amazon_Elastic_Block_Store_vol0123456789abcdef0").symlink_to(root)
    return drives


def test_trn1s_four_drives_become_one_raid0_file_system_under_the_exports(make_host: MakeHost) -> None:
    plan = make_plan("trn1.32xlarge", 2, model_id=MODEL)
    host = make_host(16)
    drives = _drives(host, 4)
    result = host.boot(boot_of(plan))
    assert result.returncode == 0, result.stdout[-3000:]
    array = str(host.path("/dev/md/neuron-serving"))
    [create] = host.calls("mdadm")
    assert create == ["--create", array, "--run", "--level=0", "--raid-devices=4", *drives]
    [mkfs] = host.calls("mkfs.ext4")
    assert mkfs == ["-q", "-F", "-L", "neuron-serving", "-E", "nodiscard,lazy_itable_init=1", array]
    assert host.calls("mount") == [[array, str(host.path("/var/lib/neuron-serving"))]]
    assert host.path("/etc/fstab").read_text().splitlines()[-1] == (
        "LABEL=neuron-serving /var/lib/neuron-serving ext4 defaults,nofail 0 2")
    # Before the tools and the export, which then write onto it.
    steps = [line.split("step: ")[1] for line in result.stdout.splitlines() if "neuron-serving: step: " in line]
    assert steps[steps.index("storage") + 1] == "install-tools"


def test_one_drive_is_used_as_it_is(make_host: MakeHost) -> None:
    plan = make_plan("trn1.2xlarge", 2, model_id="meta-llama/Llama-3.2-1B-Instruct")
    host = make_host(1)
    [drive] = _drives(host, 1)
    assert host.boot(boot_of(plan)).returncode == 0
    assert host.calls("mdadm") == []
    assert host.calls("mkfs.ext4")[0][-1] == drive
    assert host.calls("mount") == [[drive, str(host.path("/var/lib/neuron-serving"))]]


def test_a_warm_pool_host_and_an_inf2_host_keep_their_exports_on_the_root_volume() -> None:
    warm = boot_of(make_plan("trn1.32xlarge", 2, model_id=MODEL), BootOptions(signal=SIGNAL, warm_pool_hook=HOOK))
    inf2 = boot_of(make_plan("inf2.24xlarge", 2, model_id=MODEL))
    for boot in (warm, inf2):
        steps = next(text for path, text in boot.files.items() if path.endswith("boot-steps"))
        assert "run_step storage" not in steps and "mdadm" not in steps
