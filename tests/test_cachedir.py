"""cachedir: the package's cache folder, its fallback, and the atomic writer every table
and header file goes through."""

import os
import stat

import pytest

from mlx_w8a8 import cachedir


def test_the_environment_names_the_cache_dir(monkeypatch, tmp_path):
    monkeypatch.setenv(cachedir.ENV_CACHE_DIR, str(tmp_path / "c"))
    assert cachedir.cache_dir() == str(tmp_path / "c")
    monkeypatch.delenv(cachedir.ENV_CACHE_DIR)
    assert cachedir.cache_dir() != str(tmp_path / "c") and "mlx_w8a8" in cachedir.cache_dir()


def test_folder_is_made_under_the_cache_dir(monkeypatch, tmp_path):
    monkeypatch.setenv(cachedir.ENV_CACHE_DIR, str(tmp_path / "c"))
    path = cachedir.folder("headers")
    assert path == str(tmp_path / "c" / "headers") and os.path.isdir(path)


def test_folder_falls_back_to_the_temporary_directory(monkeypatch, tmp_path):
    # A cache dir that cannot be a folder (a file is in the way): the temporary
    # directory's per-user folder stands in, so the CUDA headers still have a home.
    blocker = tmp_path / "file"
    blocker.write_text("")
    monkeypatch.setenv(cachedir.ENV_CACHE_DIR, str(blocker))
    monkeypatch.setattr(cachedir.tempfile, "gettempdir", lambda: str(tmp_path / "tmp"))
    path = cachedir.folder("locks")
    assert path.startswith(str(tmp_path / "tmp" / "mlx_w8a8-")) and os.path.isdir(path)
    assert blocker.read_text() == ""


def test_folder_says_what_it_tried_when_nothing_is_writable(monkeypatch, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    monkeypatch.setenv(cachedir.ENV_CACHE_DIR, str(blocker))
    monkeypatch.setattr(cachedir.tempfile, "gettempdir", lambda: str(blocker))
    with pytest.raises(OSError, match=r"no writable folder for locks .*file.*; set "
                                      r"MLX_W8A8_CACHE_DIR to a writable folder"):
        cachedir.folder("locks")


def test_write_text_atomic_replaces_whole_and_keeps_permission_bits(tmp_path):
    path = tmp_path / "t.json"
    cachedir.write_text_atomic(str(path), "first\n")
    umask = cachedir._umask()
    assert path.read_text() == "first\n"
    assert stat.S_IMODE(path.stat().st_mode) == 0o666 & ~umask  # not mkstemp's 0600
    os.chmod(path, 0o640)
    cachedir.write_text_atomic(str(path), "second\n")
    assert path.read_text() == "second\n" and stat.S_IMODE(path.stat().st_mode) == 0o640
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t.json"]  # no temporary left


def test_a_failed_write_leaves_the_old_file_and_no_temporary(tmp_path):
    # The target is a folder: the rename fails after the text was written elsewhere.
    target = tmp_path / "t.json"
    target.mkdir()
    (target / "inside").write_text("kept")
    with pytest.raises(OSError):
        cachedir.write_text_atomic(str(target), "new\n")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t.json"]
    assert (target / "inside").read_text() == "kept"


def test_umask_is_read_without_changing_it():
    before = os.umask(0o027)
    try:
        assert cachedir._umask() == 0o027
        assert os.umask(0o027) == 0o027  # still the process's
    finally:
        os.umask(before)
