"""``check_ranks_agree``: ranks that must hold the same inputs prove it, or all stop.

Ranks given different checkpoints or prompts compute garbage rather than fail, so each
packs what must agree into fixed-size records, one ``all_gather`` shares them, and every
rank raises the same ``RankDisagreementError``, or none does.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from slotwise.distributed.communicator import Communicator
from slotwise.distributed.errors import RankDisagreementError
from slotwise.distributed.state import TP_GROUP

#: Facts one check compares at most; every rank sends this many records, used or not.
MAX_FACTS = 16
DIGEST_BYTES = 32  # sha256
#: Bytes of a fact's ``shown`` text that travel to the other ranks (cut beyond).
SHOWN_BYTES = 96
RECORD_BYTES = DIGEST_BYTES + SHOWN_BYTES
#: Hex digits of a digest the error shows (what ``sha256sum`` prints, cut).
SHOWN_DIGEST = 12


@dataclass(frozen=True)
class Fact:
    """One thing every rank of a group must hold identically: ``data`` compared by its
    sha256, ``shown`` (else the digest) and ``fix`` for the error message."""

    name: str
    data: bytes
    shown: str = ""
    fix: str = ""


def check_ranks_agree(communicator: Communicator, facts: Sequence[Fact]) -> None:
    """Raise ``RankDisagreementError`` on every rank of ``communicator``'s group unless
    every rank passed the same ``facts`` (same names, in the same order, same data)."""
    if len(facts) > MAX_FACTS:
        raise ValueError(f"{len(facts)} facts to compare; check_ranks_agree takes {MAX_FACTS}")
    if communicator.world_size == 1:
        return
    mine = _records(facts).to(communicator.device)
    gathered = communicator.all_gather(mine.unsqueeze(0), dim=0).cpu()
    ranks = [[bytes(row.tolist()) for row in records] for records in gathered]
    message = _disagreement(communicator, facts, ranks)
    if message is not None:
        raise RankDisagreementError(message)


def _records(facts: Sequence[Fact]) -> torch.Tensor:
    """Row 0 stands for the list of fact names, row i for fact i - 1; unused rows are 0."""
    names = "\n".join(fact.name for fact in facts)
    rows = [_record(names.encode(), ", ".join(fact.name for fact in facts))]
    rows += [_record(fact.data, fact.shown) for fact in facts]
    data = bytearray(b"".join(rows).ljust((MAX_FACTS + 1) * RECORD_BYTES, b"\0"))
    return torch.frombuffer(data, dtype=torch.uint8).view(MAX_FACTS + 1, RECORD_BYTES)


def _record(data: bytes, shown: str) -> bytes:
    text = shown.encode()[:SHOWN_BYTES]
    return hashlib.sha256(data).digest() + text.ljust(SHOWN_BYTES, b"\0")


def _disagreement(
    communicator: Communicator, facts: Sequence[Fact], records: list[list[bytes]]
) -> str | None:
    """The one-line error every rank raises, computed from the gathered records alone
    (so identical on every rank); None when the ranks agree."""
    ranks = communicator.ranks
    group = (
        "tensor-parallel group" if communicator.name == TP_GROUP else f"group {communicator.name!r}"
    )
    who = f"ranks {_listed(ranks)} of the {group}"
    names = _split(ranks, [rank_records[0] for rank_records in records])
    if len(names) > 1:
        return (
            f"{who} do not compare the same facts ({_sides(names)}): they run different "
            "slotwise code; install the same slotwise on every machine"
        )
    differences, fixes = [], []
    for index, fact in enumerate(facts, start=1):
        sides = _split(ranks, [rank_records[index] for rank_records in records])
        if len(sides) > 1:
            differences.append(f"{fact.name} ({_sides(sides)})")
            if fact.fix and fact.fix not in fixes:
                fixes.append(fact.fix)
    if not differences:
        return None
    advice = f": {'; '.join(fixes)}" if fixes else ""
    return f"{who} disagree on {', '.join(differences)}{advice}"


def _split(ranks: list[int], records: list[bytes]) -> dict[bytes, list[int]]:
    """The global ranks by record, in the order of the lowest rank holding each."""
    sides: dict[bytes, list[int]] = {}
    for rank, record in zip(ranks, records, strict=True):
        sides.setdefault(record, []).append(rank)
    return sides


def _sides(sides: dict[bytes, list[int]]) -> str:
    """``rank 0: a; rank 1: b``, each side shown by its text, or by its digest where
    there is no text or two sides' texts look alike."""
    texts = [record[DIGEST_BYTES:].rstrip(b"\0").decode(errors="ignore") for record in sides]
    digests = [f"sha256 {record[:DIGEST_BYTES].hex()[:SHOWN_DIGEST]}" for record in sides]
    alike = len(set(texts)) < len(texts)
    shown = [
        f"{text}, {digest}" if text and alike else text or digest
        for text, digest in zip(texts, digests, strict=True)
    ]
    return "; ".join(
        f"{'rank' if len(ranks) == 1 else 'ranks'} {_listed(ranks)}: {text}"
        for ranks, text in zip(sides.values(), shown, strict=True)
    )


def _listed(ranks: list[int]) -> str:
    if len(ranks) <= 2:
        return " and ".join(map(str, ranks))
    return f"{', '.join(map(str, ranks[:-1]))} and {ranks[-1]}"
