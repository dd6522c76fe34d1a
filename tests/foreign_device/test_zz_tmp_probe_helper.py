from pathlib import Path
from foreign_runs import foreign_overrides
from support import torchrun
from models.hf_checkpoints import make_checkpoint
WORKER = Path(__file__).with_name("foreign_worker.py")

def test_probe(foreign_site, tmp_path):
    ck = make_checkpoint("llama", tmp_path)
    for _ in range(3):
        result = torchrun(str(WORKER), "tp", str(ck), "0", **foreign_overrides(foreign_site), SLOTWISE_DIST_TIMEOUT="120")
        print("RAW", repr(result.stdout[:1500]))
