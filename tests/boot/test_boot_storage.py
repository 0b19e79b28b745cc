"""trn1's NVMe instance store as the exports' file system (issue 26): the storage step finds the drives by
their model name, stripes several into one RAID 0 array, makes one ext4 file system on it, mounts it where
the exports live and keeps it in fstab; a warm pool's host, which is stopped, and an inf2 host, which has
none, keep the exports on the root volume. What is there already is used (issue 37, defect 3): the DLAMI's
/opt/dlami/nvme, an array built on the drives, a drive's mounted file system when no drive is free; an
array is built only from the drives nobody uses. mdadm, mkfs.ext4 and mount are stubs that record
(tests/boot/stubs): this machine has no instance store. Who uses a drive is what the kernel would say,
written under the simulated root: its mount table (/proc/self/mounts) and sysfs (/sys/block)."""

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


def _mounted(host: Host, source: str, target: str) -> None:
    """``source`` mounted at ``target``, a line of the kernel's mount table (proc_pid_mounts(5))."""
    with host.path("/proc/self/mounts").open("a") as table:
        table.write(f"{source} {target} ext4 rw,relatime 0 0\n")


def _held(host: Host, drive: str, holder: str) -> None:
    """``holder`` (an md array, say) built on ``drive``, as sysfs shows it: /sys/block/<disk>/holders/<name>
    (Linux Documentation/ABI/stable/sysfs-block)."""
    name = drive.rpartition("/")[2]
    holders = host.path(f"/sys/block/{name}/holders")
    holders.mkdir(parents=True, exist_ok=True)
    (holders / holder).touch()


def _steps(stdout: str) -> list[str]:
    return [line.split("step: ")[1] for line in stdout.splitlines() if "neuron-serving: step: " in line]


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
    steps = _steps(result.stdout)
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


def test_the_dlamis_instance_store_at_opt_dlami_nvme_is_used_as_it_is(make_host: MakeHost) -> None:
    plan = make_plan("trn1.32xlarge", 2, model_id=MODEL)
    host = make_host(16)
    drives = _drives(host, 4)
    for drive in drives:
        _held(host, drive, "md0")
    _mounted(host, "/dev/md0", "/opt/dlami/nvme")
    result = host.boot(boot_of(plan))
    assert result.returncode == 0, result.stdout[-3000:]
    assert host.calls("mdadm") == []
    assert host.calls("mkfs.ext4") == []
    exports = str(host.path("/var/lib/neuron-serving"))
    assert host.calls("mount") == [["--bind", str(host.path("/opt/dlami/nvme/neuron-serving")), exports]]
    assert host.path("/opt/dlami/nvme/neuron-serving").is_dir()
    assert host.path("/etc/fstab").read_text().splitlines()[-1] == (
        "/opt/dlami/nvme/neuron-serving /var/lib/neuron-serving none "
        "bind,nofail,x-systemd.requires-mounts-for=/opt/dlami/nvme 0 0")
    assert "exports on the instance store already mounted at /opt/dlami/nvme" in result.stdout


def test_an_array_already_assembled_on_the_drives_is_used_and_no_other_is_built(make_host: MakeHost) -> None:
    plan = make_plan("trn1.32xlarge", 2, model_id=MODEL)
    host = make_host(16)
    for drive in _drives(host, 4):
        _held(host, drive, "md127")
    assert host.boot(boot_of(plan)).returncode == 0
    array = str(host.path("/dev/md127"))
    assert host.calls("mdadm") == []
    assert host.calls("mkfs.ext4") == [
        ["-q", "-F", "-L", "neuron-serving", "-E", "nodiscard,lazy_itable_init=1", array]]
    assert host.calls("mount") == [[array, str(host.path("/var/lib/neuron-serving"))]]


def test_an_array_already_mounted_elsewhere_is_used_through_a_directory_of_its_own(make_host: MakeHost) -> None:
    plan = make_plan("trn1.32xlarge", 2, model_id=MODEL)
    host = make_host(16)
    for drive in _drives(host, 4):
        _held(host, drive, "md127")
    _mounted(host, "/dev/md127", "/mnt/scratch")
    assert host.boot(boot_of(plan)).returncode == 0
    assert host.calls("mdadm") == [] and host.calls("mkfs.ext4") == []
    assert host.calls("mount") == [
        ["--bind", str(host.path("/mnt/scratch/neuron-serving")), str(host.path("/var/lib/neuron-serving"))]]


def test_a_drive_in_use_is_left_out_and_the_array_is_built_from_the_free_ones(make_host: MakeHost) -> None:
    plan = make_plan("trn1.32xlarge", 2, model_id=MODEL)
    host = make_host(16)
    drives = _drives(host, 4)
    # The first drive's file system is mounted (by the AMI, say), the second holds a device-mapper device.
    _mounted(host, "/dev/nvme1n1", "/mnt")
    _held(host, drives[1], "dm-0")
    assert host.boot(boot_of(plan)).returncode == 0
    array = str(host.path("/dev/md/neuron-serving"))
    assert host.calls("mdadm") == [["--create", array, "--run", "--level=0", "--raid-devices=2", *drives[2:]]]
    assert host.calls("mkfs.ext4")[0][-1] == array
    assert host.calls("mount") == [[array, str(host.path("/var/lib/neuron-serving"))]]


def test_a_partitioned_drive_is_in_use_and_the_one_free_drive_is_used_alone(make_host: MakeHost) -> None:
    plan = make_plan("trn1.32xlarge", 2, model_id=MODEL)
    host = make_host(16)
    drives = _drives(host, 2)
    host.path("/sys/block/nvme1n1/nvme1n1p1").mkdir(parents=True)
    assert host.boot(boot_of(plan)).returncode == 0
    assert host.calls("mdadm") == []
    assert host.calls("mkfs.ext4")[0][-1] == drives[1]
    assert host.calls("mount") == [[drives[1], str(host.path("/var/lib/neuron-serving"))]]


def test_the_only_drive_mounted_already_is_used_where_it_is(make_host: MakeHost) -> None:
    plan = make_plan("trn1.2xlarge", 2, model_id="meta-llama/Llama-3.2-1B-Instruct")
    host = make_host(1)
    _drives(host, 1)
    _mounted(host, "/dev/nvme1n1", "/mnt")
    assert host.boot(boot_of(plan)).returncode == 0
    assert host.calls("mkfs.ext4") == []
    assert host.calls("mount") == [
        ["--bind", str(host.path("/mnt/neuron-serving")), str(host.path("/var/lib/neuron-serving"))]]


def test_exports_mounted_already_are_kept(make_host: MakeHost) -> None:
    plan = make_plan("trn1.32xlarge", 2, model_id=MODEL)
    host = make_host(16)
    _drives(host, 4)
    _mounted(host, "/dev/md127", "/var/lib/neuron-serving")
    result = host.boot(boot_of(plan))
    assert result.returncode == 0
    assert host.calls("mdadm") == [] and host.calls("mkfs.ext4") == [] and host.calls("mount") == []
    assert "exports on the instance store, mounted already" in result.stdout
