"""Every finding code drill emits: its severity, what it means, and what to do about it.

A finding's ``code`` is a wire format: alert rules, users' scripts and ``drill report`` match
on it. This catalogue is the one list of them. The tests hold the code to it — every code
that drill's source emits, and every code a finding carries anywhere in the test suite, must
be here with the severity it was emitted at — and ``docs/findings.md`` is generated from it
(``python -m drill.docs``).
"""

from __future__ import annotations

from dataclasses import dataclass

from drill.findings import Severity

ERR, WARN, INFO = Severity.ERROR, Severity.WARNING, Severity.INFO


@dataclass(frozen=True, slots=True)
class Code:
    code: str
    severities: tuple[Severity, ...]
    """Every severity the code is emitted at (the first is the usual one)."""
    area: str
    meaning: str
    hint: str


_AREAS = {
    "discovery": "Finding the checkpoint",
    "files": "Files and bytes",
    "seal": "The seal (drill-manifest.json)",
    "structure": "Structure of unsealed files",
    "load": "Loading the entries",
    "parts": "Completeness of the state",
    "contract": "Consistency of the state",
    "pointer": "Resume pointers",
    "replay": "Deterministic replay",
    "durable": "The durable copy",
    "audit": "The tamper-evident log",
}
"""Area → its heading in the generated catalogue, in the order a drill meets them."""


def _codes(*rows: tuple[str, tuple[Severity, ...], str, str, str]) -> dict[str, Code]:
    return {r[0]: Code(*r) for r in rows}


VERIFY = "drill verify CHECKPOINT --json names the file and byte range; drill last-good RUN_ROOT gives the checkpoint to resume from"
RESAVE = "resume from the previous checkpoint (drill last-good RUN_ROOT) and fix the save that wrote this one"

CODES: dict[str, Code] = _codes(
    # finding the checkpoint
    (
        "no-checkpoint",
        (ERR,),
        "discovery",
        "The run root holds no complete checkpoint to drill (or not the one asked for).",
        "drill runs RUN_ROOT lists what drill sees; check --checkpoint and the run root",
    ),
    (
        "final-export",
        (INFO,),
        "discovery",
        "Weights at the top of the run are a final export, not a resumable checkpoint.",
        "nothing to do: drills use the checkpoint directories",
    ),
    (
        "incomplete-save",
        (ERR,),
        "discovery",
        "The directory is a save that never finished (no index, or a marker of an unfinished write).",
        "drill the newest complete checkpoint: drill run RUN_ROOT --checkpoint latest",
    ),
    (
        "format-unknown",
        (ERR,),
        "discovery",
        "A file is neither a torch.save archive nor safetensors.",
        "drill verify names the file; remove it or seal the checkpoint so it is covered by a hash",
    ),
    (
        "not-regular",
        (ERR,),
        "discovery",
        "The path given is not a regular file or directory (a FIFO, a socket, a device).",
        "point drill at the checkpoint directory",
    ),
    (
        "checkpoint-not-loaded",
        (ERR,),
        "discovery",
        "The checkpoint did not load at all in a verified resume.",
        "the other findings of the load say why; drill.sdk.last_good gives the fallback",
    ),
    # files and bytes
    ("file-missing", (ERR,), "files", "A file the index or the seal names is not there.", RESAVE),
    (
        "file-unreadable",
        (ERR,),
        "files",
        "A file could not be read (permissions, storage errors after every retry).",
        "check the credentials and permissions drill runs with, and the storage; then drill again",
    ),
    (
        "file-changed",
        (ERR,),
        "files",
        "A file changed size while the drill read it: something is writing into the checkpoint.",
        "drill again once the save has finished; if it recurs, a save is writing into a finished checkpoint",
    ),
    (
        "storage-denied",
        (ERR,),
        "files",
        "The storage refused to serve a file (credentials, permissions): nothing is known about its bytes.",
        "check the credentials and permissions drill runs with; then drill again",
    ),
    (
        "storage-unavailable",
        (ERR,),
        "files",
        "The storage kept failing to serve a file after every retry: nothing is known about its bytes.",
        "check that the storage is reachable and healthy; then drill again",
    ),
    (
        "file-not-regular",
        (ERR,),
        "files",
        "A FIFO, socket or device where a file should be: never opened (it could hang the drill).",
        "remove it from the checkpoint directory",
    ),
    (
        "file-unlisted",
        (ERR, WARN),
        "files",
        "A file is in the checkpoint but not in its seal: added after sealing.",
        "remove it, or re-seal knowingly: drill seal CHECKPOINT --force",
    ),
    (
        "size-mismatch",
        (ERR,),
        "files",
        "A file's size differs from the size it was sealed at: truncated or grown.",
        VERIFY,
    ),
    (
        "digest-mismatch",
        (ERR,),
        "files",
        "A file's bytes differ from its sealed hash: bit rot, a partial overwrite, or tampering.",
        VERIFY,
    ),
    (
        "crc-mismatch",
        (ERR,),
        "files",
        "A torch.save record fails its own CRC-32: the bytes changed after they were written.",
        VERIFY,
    ),
    (
        "path-escapes",
        (ERR,),
        "files",
        "A listed path leads out of the checkpoint (a link or a '..'): never followed.",
        "remove the link; drill reads nothing outside the checkpoint",
    ),
    (
        "listing-too-large",
        (ERR,),
        "files",
        "Listing the checkpoint ran past drill's bounds (files, depth or time).",
        "a checkpoint directory should hold the checkpoint only; move other data out",
    ),
    # the seal
    (
        "not-sealed",
        (ERR,),
        "seal",
        "The checkpoint carries no seal and sealed checkpoints are required (--require-sealed).",
        "seal at save time (drill.sdk.save) or now: drill seal CHECKPOINT",
    ),
    (
        "manifest-unreadable",
        (ERR,),
        "seal",
        "drill-manifest.json cannot be read.",
        "check the file's permissions and storage; re-seal if it is lost: drill seal CHECKPOINT --force",
    ),
    (
        "manifest-not-json",
        (ERR,),
        "seal",
        "drill-manifest.json is not JSON.",
        "re-seal knowingly (drill seal CHECKPOINT --force) once the checkpoint is verified another way",
    ),
    (
        "manifest-digest-mismatch",
        (ERR,),
        "seal",
        "drill-manifest.json does not match its own digest: edited or damaged.",
        "re-seal knowingly (drill seal CHECKPOINT --force) once the checkpoint is verified another way",
    ),
    (
        "manifest-invalid",
        (ERR,),
        "seal",
        "drill-manifest.json is JSON but not a valid seal (fields missing or of the wrong type; sizes, chunk size and chunk digests that disagree).",
        "re-seal knowingly: drill seal CHECKPOINT --force",
    ),
    (
        "manifest-path-escapes",
        (ERR,),
        "seal",
        "The seal names a path outside the checkpoint: refused, nothing read through it.",
        "the seal was forged or damaged; re-seal knowingly: drill seal CHECKPOINT --force",
    ),
    (
        "foreign-manifest-invalid",
        (ERR,),
        "seal",
        "A framework's own hash manifest (e.g. a SHA-256 list) is malformed.",
        "regenerate it with the framework, or remove it",
    ),
    (
        "manifest-unauthenticated",
        (ERR,),
        "seal",
        "A seal key is configured but the seal carries no HMAC: it could have been recomputed by anyone.",
        "seal with the key (DRILL_SEAL_KEY_FILE / --key-file)",
    ),
    (
        "manifest-hmac-mismatch",
        (ERR,),
        "seal",
        "The seal's HMAC does not verify under the configured key: forged, or sealed with another key.",
        "check which key sealed it; never trust the checkpoint until it verifies",
    ),
    # structure of unsealed files
    ("zip-corrupt", (ERR,), "structure", "A torch.save archive's zip structure is unreadable.", VERIFY),
    ("zip-record-corrupt", (ERR,), "structure", "A record inside a torch.save archive is damaged.", VERIFY),
    (
        "zip-record-compressed",
        (ERR,),
        "structure",
        "A record is compressed, which torch.save never does: not inflated (a zip bomb could be), not loaded.",
        "the file was not written by torch.save; find what wrote it",
    ),
    (
        "pickle-names-code",
        (ERR,),
        "structure",
        "A torch.save file's pickle names code (os.system, builtins.getattr, torch.load, …) that the trainer's own unpickler would run on resume: never run, never loaded.",
        "treat the checkpoint as hostile: resume from drill last-good RUN_ROOT and find what wrote the file",
    ),
    ("safetensors-corrupt", (ERR,), "structure", "A safetensors header is unreadable or runs past its file.", VERIFY),
    ("json-corrupt", (ERR,), "structure", "A JSON side file (trainer state, index) is not valid JSON.", RESAVE),
    (
        "entry-out-of-bounds",
        (ERR,),
        "structure",
        "An entry is stored past the end of its file: the file is truncated.",
        VERIFY,
    ),
    ("entries-overlap", (ERR,), "structure", "Two entries claim the same bytes of a file.", RESAVE),
    (
        "bytes-uncovered",
        (WARN, ERR),
        "structure",
        "Bytes of a file belong to no entry: unexplained data (the file is longer than its index says).",
        "drill verify CHECKPOINT; seal checkpoints at save time to have every byte hashed",
    ),
    (
        "index-mismatch",
        (ERR,),
        "structure",
        "An index places tensors in a shard that does not hold them: a load would fail.",
        RESAVE,
    ),
    (
        "metadata-implausible",
        (ERR,),
        "structure",
        "The index claims more than its files can hold (e.g. a 2^40-element tensor): nothing allocated.",
        "the index is damaged or forged; resume from drill last-good RUN_ROOT",
    ),
    # loading the entries
    (
        "metadata-unreadable",
        (ERR,),
        "load",
        "The checkpoint's index (.metadata) cannot be read or unpickled safely.",
        RESAVE,
    ),
    (
        "unsafe-pickle",
        (ERR,),
        "load",
        "A pickle names a global outside the allow-list: refused, nothing in it executed.",
        "if the class is yours and trusted, allow it (--allow-class module.Class, or contract.allow_classes in the policy); otherwise treat the checkpoint as hostile",
    ),
    ("entry-not-loaded", (ERR,), "load", "An entry did not load (a damaged or foreign value).", RESAVE),
    (
        "pickle-bomb",
        (ERR,),
        "load",
        "A pickle whose object no walk could finish: shared references nested on each other (a few KB that are 10^30 items walked), or nesting hundreds deep. Refused unwalked; nothing in it executed.",
        "no trainer writes such a file: treat the checkpoint as hostile or corrupted, and resume from another",
    ),
    (
        "entries-lost-with-file",
        (ERR,),
        "load",
        "Every entry stored in an unreadable or damaged file is lost with it.",
        RESAVE,
    ),
    (
        "recipe-state-stale",
        (WARN, ERR),
        "load",
        "torchtune's recipe state belongs to another epoch than the checkpoint it sits beside.",
        "resume from the checkpoint whose recipe state matches its epoch",
    ),
    (
        "recipe-state-ahead",
        (ERR,),
        "load",
        "torchtune's recipe state claims more epochs ran than any saved epoch's weights: a resume would skip the epochs between.",
        "the recipe state was written by a save whose weights are gone, or forged; resume from an epoch whose recipe state matches",
    ),
    # completeness
    (
        "part-missing",
        (ERR, WARN),
        "parts",
        "A part of the training state (model, optimizer, scheduler, RNG, data loader, train state) is absent.",
        "save the part (drill.sdk helpers or the framework's option), or accept it: --allow-missing PART",
    ),
    (
        "part-incomplete",
        (ERR,),
        "parts",
        "A part is present but lacks entries a resume needs.",
        "save the whole part; drill show DRILL_ID --json lists what is missing",
    ),
    (
        "part-not-saved-by-layout",
        (ERR, WARN),
        "parts",
        "This format never saves the part (e.g. a weights-only export): a resume loses it.",
        "save with a layout that includes it, or accept it: --allow-missing PART",
    ),
    (
        "part-unknown",
        (INFO,),
        "parts",
        "State outside the canonical parts: restored but not checked.",
        "nothing to do; name it in the policy's contract to have it checked",
    ),
    (
        "model-without-tensors",
        (ERR,),
        "parts",
        "The model part holds no tensors: a resume would start from untrained weights.",
        RESAVE,
    ),
    # consistency of the state
    (
        "step-mismatch",
        (ERR,),
        "contract",
        "The step counters of the parts disagree (train state, optimizer, scheduler, directory name).",
        "find which counter the trainer forgot to save or restore",
    ),
    (
        "optimizer-slot-missing",
        (ERR,),
        "contract",
        "An optimizer moment (exp_avg, exp_avg_sq) is missing for a parameter.",
        "a resume would restart those moments from zero and spike the loss; fix the save",
    ),
    (
        "optimizer-slot-mismatch",
        (ERR,),
        "contract",
        "An optimizer moment's shape or dtype does not match its parameter: state of a different model.",
        "resume the optimizer that belongs to this model",
    ),
    ("optimizer-partition-missing", (ERR,), "contract", "A rank's optimizer partition (ZeRO/FSDP) is missing.", RESAVE),
    (
        "optimizer-partition-mismatch",
        (ERR,),
        "contract",
        "The ranks' optimizer partitions do not add up to the parameter groups.",
        RESAVE,
    ),
    (
        "param-in-two-groups",
        (ERR,),
        "contract",
        "A parameter is in more than one param group: a resume would step it twice.",
        "fix the optimizer's param groups",
    ),
    (
        "param-never-updated",
        (INFO,),
        "contract",
        "Parameters in the param groups have no optimizer state at all while others have: never updated, as frozen parameters are (a LoRA run's base weights).",
        "nothing, if the run freezes them; a parameter with part of its state is optimizer-slot-missing",
    ),
    (
        "param-not-optimized",
        (WARN,),
        "contract",
        "Trainable parameters are in no param group.",
        "check that freezing them was intended",
    ),
    (
        "rng-rank-missing",
        (ERR, WARN),
        "contract",
        "A rank saved no RNG state: it would draw different random numbers on resume.",
        "save every rank's RNG state with the checkpoint",
    ),
    (
        "rng-generator-missing",
        (ERR, WARN),
        "contract",
        "A generator's state (CPU, CUDA) is missing from a rank's RNG state.",
        "save every generator the run draws from",
    ),
    (
        "dataloader-rank-missing",
        (ERR, WARN),
        "contract",
        "A rank saved no data-loader state: it would restart its data at the epoch start.",
        "save every rank's data-loader state with the checkpoint",
    ),
    (
        "dataloader-position-only",
        (ERR, WARN),
        "contract",
        "The loader state holds a position but no shuffle state: a resume continues on a differently shuffled stream.",
        "save the sampler's seed or generator with the position",
    ),
    (
        "dataloader-step-mismatch",
        (ERR, WARN),
        "contract",
        "The loader's consumed batches disagree with the train step: a resume would skip or repeat data.",
        "save the loader state at the same step as the model",
    ),
    (
        "non-finite",
        (ERR, WARN, INFO),
        "contract",
        "A tensor holds NaN or Inf values.",
        "resume from a checkpoint before the values went non-finite (drill last-good RUN_ROOT)",
    ),
    (
        "still-zero",
        (WARN,),
        "contract",
        "A tensor that training updates is all zeros: never updated, or re-initialized on save.",
        "check the save path of that state",
    ),
    # resume pointers
    (
        "pointer-ahead",
        (ERR,),
        "pointer",
        "The 'latest' pointer names a step newer than any complete checkpoint.",
        "point it at the newest complete checkpoint (drill last-good RUN_ROOT)",
    ),
    (
        "pointer-dangling",
        (ERR,),
        "pointer",
        "The pointer names something that is not a checkpoint here.",
        "point it at the newest complete checkpoint (drill last-good RUN_ROOT)",
    ),
    (
        "pointer-incomplete",
        (ERR,),
        "pointer",
        "The pointer names an incomplete save.",
        "point it at the newest complete checkpoint (drill last-good RUN_ROOT)",
    ),
    (
        "newest-incomplete",
        (WARN,),
        "pointer",
        "The newest save is incomplete: auto-resume would fall back and lose steps.",
        "find why the last save did not finish (a crash during save, a full disk)",
    ),
    # replay
    (
        "not-replayable",
        (INFO,),
        "replay",
        "The replay could not run (no reference log, no entrypoint): a gap in the evidence, not a failure.",
        "configure replay in the policy (docs/replay.md)",
    ),
    (
        "replay-entrypoint-refused",
        (ERR,),
        "replay",
        "The replay entrypoint was refused: it would import code from the run directory or the checkpoint.",
        "name an entrypoint installed in drill's environment, or its file in the policy",
    ),
    (
        "replay-error",
        (ERR,),
        "replay",
        "The replay harness itself failed.",
        "drill show DRILL_ID prints the harness's traceback",
    ),
    (
        "replay-diverged",
        (ERR,),
        "replay",
        "The replayed steps diverged from what the original run logged.",
        "compare the state saved with what the trainer restores: RNG, data order, optimizer",
    ),
    (
        "replay-diverged-data",
        (ERR,),
        "replay",
        "The replay drew different batches than the original run: the data-loader state is wrong.",
        "save and restore the loader's position and shuffle state",
    ),
    (
        "replay-diverged-loss",
        (ERR,),
        "replay",
        "The replayed loss differs from the original run's beyond tolerance.",
        "check RNG, optimizer and scheduler state",
    ),
    (
        "replay-diverged-grad_norm",
        (ERR,),
        "replay",
        "The replayed gradient norm differs from the original run's beyond tolerance.",
        "check optimizer and model state",
    ),
    (
        "replay-diverged-keys",
        (ERR,),
        "replay",
        "The replay's training objects do not take the checkpoint's keys: they ask for keys it lacks, or leave keys it holds.",
        "a renamed or removed parameter: map the old keys on load (a state-dict hook), or keep the names",
    ),
    (
        "replay-diverged-classes",
        (ERR,),
        "replay",
        "Under a candidate environment the checkpoint does not restore: a class or module it needs moved or was renamed.",
        "keep an alias at the old import path, or convert the checkpoint before upgrading",
    ),
    # the durable copy
    (
        "durable-missing",
        (ERR,),
        "durable",
        "A file of the checkpoint is missing from its durable copy.",
        "re-copy the checkpoint to durable storage",
    ),
    (
        "durable-extra",
        (WARN,),
        "durable",
        "The durable copy holds a file the checkpoint does not.",
        "remove it from the durable copy, or find what wrote it",
    ),
    (
        "durable-size-mismatch",
        (ERR,),
        "durable",
        "A file's size in the durable copy differs from the checkpoint's.",
        "re-copy the checkpoint to durable storage",
    ),
    (
        "durable-digest-mismatch",
        (ERR,),
        "durable",
        "A file's bytes in the durable copy differ from the checkpoint's.",
        "re-copy the checkpoint to durable storage",
    ),
    (
        "durable-unreadable",
        (ERR,),
        "durable",
        "A file of the durable copy cannot be read.",
        "check the durable storage's credentials and health",
    ),
    # the tamper-evident log
    (
        "chain-missing",
        (ERR,),
        "audit",
        "The audit_log table is gone: the tamper-evident log was dropped.",
        "restore the database from backup; every record since is unproven",
    ),
    (
        "entry-edited",
        (ERR,),
        "audit",
        "An audit entry does not match its own hash: edited.",
        "restore the database from backup; investigate who had write access",
    ),
    (
        "entry-forged",
        (ERR,),
        "audit",
        "An audit entry fails its HMAC: written without the audit key.",
        "investigate who had write access to the database",
    ),
    (
        "entry-unauthenticated",
        (ERR,),
        "audit",
        "An audit entry carries no HMAC although an audit key is configured.",
        "investigate; entries sealed before the key was configured say so by their time",
    ),
    (
        "entry-other-key",
        (ERR,),
        "audit",
        "An audit entry claims another audit key.",
        "check DRILL_AUDIT_KEY_FILE names the key the log was written with",
    ),
    (
        "entry-downgraded",
        (ERR,),
        "audit",
        "An entry is in an older format after newer ones: forged to dodge a check.",
        "investigate who had write access to the database",
    ),
    ("entries-missing", (ERR,), "audit", "Entries of the chain are gone: deleted.", "restore the database from backup"),
    (
        "link-broken",
        (ERR,),
        "audit",
        "An entry does not follow the one before it: entries reordered, edited or replaced.",
        "restore the database from backup",
    ),
    (
        "head-missing",
        (ERR,),
        "audit",
        "The pinned chain head is not in the chain: the log was rewritten or truncated.",
        "restore the database from backup",
    ),
    (
        "record-edited",
        (ERR,),
        "audit",
        "A drill record differs from what its audit entry sealed: edited after it was recorded.",
        "restore the database from backup",
    ),
    (
        "record-deleted",
        (ERR,),
        "audit",
        "A drill record sealed in the chain is gone: deleted.",
        "restore the database from backup",
    ),
    (
        "record-resealed",
        (ERR,),
        "audit",
        "A drill record was changed and sealed again: a rewrite of history.",
        "restore the database from backup",
    ),
    (
        "record-unsealed",
        (ERR, WARN),
        "audit",
        "A closed drill record is in no audit entry: inserted or closed outside drill.",
        "investigate who wrote it; drills of drill itself are always sealed",
    ),
)


def describe(code: str) -> Code | None:
    """The catalogue entry of ``code`` (None for a code drill does not emit)."""
    return CODES.get(code)


def areas() -> list[tuple[str, list[Code]]]:
    """The catalogue grouped by area, in the order a drill meets them."""
    return [(title, [c for c in CODES.values() if c.area == area]) for area, title in _AREAS.items()]


__all__ = ["CODES", "Code", "areas", "describe"]
