"""Where tests find the repository and their data files."""
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "tests" / "data"
LOCUSTFILE = ROOT / "loadgen" / "locust" / "locustfile.py"
