"""``opreg export FOLDER`` over every (family, task) pair of opreg-transformers' encoder-decoder
loader (``opreg_transformers.seq2seq``): each exported, verified and its decoding checked as by
default.

For each family of ``opreg_transformers.seq2seq.FAMILIES`` and each task (text2text-generation and
feature-extraction, each with and without past; optimum's synonyms translation and summarization
are text2text-generation), a tiny random checkpoint (``tests/seq2seq_models.py``: a
``...ForConditionalGeneration`` for text2text-generation, the bare ``...Model`` for
feature-extraction) is written with ``save_pretrained`` and exported with
``opreg.export_checkpoint``. One row per pair: the files written, the largest difference of any
model from eager PyTorch at its two sizes, the loop check's largest difference over 24 decoding
steps (every greedy token equal to ``generate``'s), and the export's CPU seconds in this process
(capture, translation, merge, verification, loop; torch and transformers already imported).

    python bench/checkpoint_seq2seq.py                  # every pair
    python bench/checkpoint_seq2seq.py --only t5 bart   # some families
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def sweep(work: Path, families: list[str]) -> int:
    from opreg_transformers import seq2seq

    import opreg
    from tests import seq2seq_models

    failed = 0
    print("| family | task | result | files | max abs vs eager | decoding | export CPU s |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for family in families:
        for head, (auto, _) in seq2seq.HEADS.items():
            folder = seq2seq_models.checkpoint(family, work / f"{family}-{head}", auto=auto)
            for task in (head + seq2seq.PAST_SUFFIX, head):
                started = time.process_time()
                try:
                    result = opreg.export_checkpoint(folder, work / f"{family}-{task}-onnx", task=task)
                except Exception as e:  # a row of the table, not the end of the sweep
                    failed += 1
                    print(f"| {family} | {task} | {type(e).__name__}: {str(e).splitlines()[0][:120]} | | | | |")
                    continue
                worst = max(c.max_abs for m in result.models for v in m.verified for c in v.outputs)
                models = sum(name.endswith(".onnx") for name in result.files)
                decoding = result.checks[0].rsplit(" within ", 1)[1]
                seconds = time.process_time() - started
                print(f"| {family} | {task} | verified | {models} models | {worst:.2g} | {decoding} | {seconds:.1f} |")
            sys.stdout.flush()
    return failed


def main() -> int:
    from opreg_transformers import seq2seq

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="+", choices=sorted(seq2seq.FAMILIES), help="these families only")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as work:
        return 1 if sweep(Path(work), args.only or sorted(seq2seq.FAMILIES)) else 0


if __name__ == "__main__":
    sys.exit(main())
