"""python -m dpcost.plan refuses what would hang it, lie about it or write elsewhere (issue 39
Sec. 3): a user's module that hangs, calls sys.exit or prints; --plot at a folder or
/dev/full; a CPU fallback larger than the machine. Each used to get through."""

from __future__ import annotations

import json
import time

import pytest

pytest.importorskip("torch")

from dpcost.plan.__main__ import main  # noqa: E402


def _module(tmp_path, monkeypatch, name, body):
    (tmp_path / f"{name}.py").write_text(body)
    monkeypatch.syspath_prepend(str(tmp_path))
    return name


def _run(argv, capfd):
    status = main(argv)
    out, err = capfd.readouterr()
    return status, out, err


BUILD = ("import torch\n"
         "def build():\n"
         "    return torch.nn.Linear(8, 8)\n")


@pytest.mark.parametrize("where", ["import", "forward"])
def test_a_hang_is_stopped_after_the_timeout_and_named(tmp_path, monkeypatch, capfd, where):
    hang = "while True:\n    pass\n"
    body = (hang + BUILD if where == "import" else
            "import torch, time\n"
            "class Slow(torch.nn.Linear):\n"
            "    def forward(self, x):\n"
            "        time.sleep(600)\n"
            "def build():\n"
            "    return Slow(8, 8)\n")
    name = _module(tmp_path, monkeypatch, f"hangs_at_{where}", body)
    started = time.monotonic()
    status, out, err = _run(["--model", f"{name}:build", "--input-shape", "2,8",
                             "--timeout", "1"], capfd)
    assert time.monotonic() - started < 30
    assert status == 2 and out == "" and err.count("\n") == 1
    assert "--timeout" in err and name in err


@pytest.mark.parametrize("where", ["import", "build"])
def test_sys_exit_0_in_the_module_is_a_failure_naming_it(tmp_path, monkeypatch, capfd, where):
    body = ("import sys\nsys.exit(0)\n" + BUILD if where == "import" else
            "import sys\ndef build():\n    sys.exit(0)\n")
    name = _module(tmp_path, monkeypatch, f"exits_at_{where}", body)
    status, out, err = _run(["--model", f"{name}:build", "--input-shape", "2,8"], capfd)
    assert status == 2 and out == "" and err.count("\n") == 1
    assert "--model" in err and name in err


def test_prints_in_the_module_go_to_stderr_and_json_stays_json(tmp_path, monkeypatch, capfd):
    body = ("import os\nprint('hello from import')\n"
            "os.write(1, b'hello from C\\n')\n"  # the file descriptor, not sys.stdout
            + BUILD.replace("def build():\n", "def build():\n    print('hello from build')\n"))
    name = _module(tmp_path, monkeypatch, "chatty", body)
    status, out, err = _run(["--model", f"{name}:build", "--input-shape", "2,8", "--gpus", "2",
                             "--json"], capfd)
    assert status == 0
    assert json.loads(out)["trainable_parameters"] == 8 * 8 + 8
    assert "hello from import" in err and "hello from C" in err and "hello from build" in err


def test_plot_at_a_folder_or_dev_full_is_refused(tmp_path, capfd):
    status, _, err = _run(["--model", "ResNet-50", "--plot", str(tmp_path)], capfd)
    assert status == 2 and "--plot" in err and err.count("\n") == 1
    assert not tmp_path.with_suffix(".png").exists()  # matplotlib used to write folder.png
    status, _, err = _run(["--model", "ResNet-50", "--plot", "/dev/full"], capfd)
    assert status == 2 and "--plot" in err and err.count("\n") == 1
    full = tmp_path / "plan.png"
    full.symlink_to("/dev/full")  # a good name that cannot be written: the write fails
    status, _, err = _run(["--model", "ResNet-50", "--gpus", "2", "--plot", str(full)], capfd)
    assert status != 0 and "--plot" in err and err.count("\n") == 1


def test_cpu_fallback_checks_memory_before_building(tmp_path, monkeypatch, capfd):
    # A module that builds its parameters, then fails on meta (.item() has no value there);
    # with 40 MB of MemAvailable its 16 MB of parameters need 64 MB to train: refused
    # before the CPU build, which the module counts.
    import dpcost.plan.build as build

    body = ("import torch\nCALLS = []\n"
            "def build():\n"
            "    CALLS.append(1)\n"
            "    m = torch.nn.Linear(2000, 2000)\n"
            "    m.weight.sum().item()\n"
            "    return m\n")
    name = _module(tmp_path, monkeypatch, "fails_on_meta", body)
    monkeypatch.setattr(build, "mem_available_bytes", lambda: 40_000_000)
    status, _, err = _run(["--model", f"{name}:build", "--input-shape", "2,2000"], capfd)
    assert status == 2 and "--model" in err and "MemAvailable" in err
    import importlib

    assert importlib.import_module(name).CALLS == [1]  # built on meta only
