"""The repository carries no database files of an example's run."""
import subprocess
from pathlib import Path


def test_no_sqlite_files_are_tracked() -> None:
    root = Path(__file__).resolve().parents[2]
    tracked = subprocess.run(["git", "ls-files"], cwd=root, capture_output=True, text=True,
                             check=True).stdout.split()
    assert [p for p in tracked if ".sqlite3" in p] == []
