"""Fit every calibrated number for one embedding model and write its calibration profile — one command.

    python -m tools.eval.calibrate --embedding-model models/bge-small-zh-v1.5 --kb-cache /work/cache/kb \
        --dump-dir /work/cache/calib [--sets xquad_zh,cmrc_trial,...] [--out pipeline/calibration] [--steps fusion,…] \
        [--by-family] [--weigh families] [--features cos1,qlen]

Writes <out>/<model slug>.json (pipeline/calibration/store.py), which the app reads at its next model load; every
section carries its provenance (the model, the dev sets, this command, the day, the left-out metrics). The steps are
the fits the separate tools run (docs/retrieval-eval.md), in the order their inputs need:

 1. the dev-set knowledge bases, built with this model (tools/kb_cache.py; cached per model: <kb-cache>/<slug>/,
    the packaged e5's in <kb-cache>/ itself, as before);
 2. fusion — full-information candidate dumps (tools/evaluate.py), leave-one-set-out and the fit on every set
    (tools/fusion_cv.py): the α model and the fragment prior;
 3. gate — feature dumps over the fusion just fitted (tools/gate_dataset.py), leave-one-set-out and the fit on
    every set (tools/calibrate_gate.py): both logistic models and the open band; the hard floor min_similarity;
 4. extractive picker — candidate dumps (tools/extractive_dataset.py), leave-one-set-out and the fit
    (tools/calibrate_extractive.py);
 5. support check — claims from the SQuAD-format sets among --sets (tools/calibrate_support.py).
Each step's engines run on the profile as fitted so far (a draft in <dump-dir>/<slug>/profile, searched first
through $KBQA_CALIBRATION_DIR). A step that cannot be fitted on the sets given (leaving one set — or family — out
needs two) keeps the generic profile's section and says why in its provenance. The adaptive-RRF rule of fusion_mode=rrf has no
fitting code (it was chosen on a grid once, for the packaged e5) and is carried over from the generic profile.
The dev data is $KBQA_SHARED_DATA or ../shared/data, laid out as tools/kb_cache.DEV_SETS says.

`regulations` (the formal-documents family: the regulations knowledge base and tests/data/regulations_dev) may be
one of --sets: its fusion dump, its gate rows (its same-domain unanswerable questions and the everyday off-topic ones
as the negatives) and its picker rows are the separate tools' (tools/eval/gate_dataset.py, extractive_dataset.py);
the support check has no claims of it. --by-family: the left-out metrics of the provenance leave out a family of
text at a time (tools/eval/devsets.FAMILIES) instead of a set, as docs/retrieval-eval.md's protocol does; --weigh
families: in the fusion's fit each family weighs alike, not each set (fusion_cv.set_weights) — so the three
encyclopedic sets do not outvote the others; --features: the inputs the α model reads (fusion.AUTO_FEATURES, all by
default).
"""
from __future__ import annotations

import contextlib
import datetime
import os
import shlex
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

from pipeline.calibration import CalibrationProfile, generic, profile_for, read, slug, write
from pipeline.calibration.profile import (
    ExtractiveCalibration,
    FloorCalibration,
    FusionCalibration,
    GateCalibration,
    Provenance,
    SupportCalibration,
)
from pipeline.calibration.store import DIR_ENV, PACKAGE_DIR
from pipeline.models.paths import PACKAGED_MODEL_ID, embedding_model_id
from tools.eval import calibrate_extractive as cx
from tools.eval import calibrate_gate as cg
from tools.eval import calibrate_support as cs
from tools.eval import extractive_dataset, fusion_cv, gate_dataset
from tools.eval.cli import add_kb_cache, command_parser, kb_cache_root
from tools.eval.devsets import DEV_SETS, load_corpus
from tools.eval.evaluate import evaluate_set
from tools.eval.kb_cache import ensure_built
from tools.eval.regulations_devset import REGULATIONS

REPO = Path(__file__).resolve().parents[2]
PER_SET = {"gate": 800, "extractive": 240, "support": 150}  # the separate tools' defaults
SETS = (*DEV_SETS, REGULATIONS.name)  # what --sets may name


def devset(name: str):
    return REGULATIONS if name == REGULATIONS.name else DEV_SETS[name]


@contextlib.contextmanager
def searched_first(directory: Path) -> Iterator[None]:
    """Engines opened inside read calibration profiles from `directory` first (the draft being fitted)."""
    old = os.environ.get(DIR_ENV)
    os.environ[DIR_ENV] = str(directory)
    try:
        yield
    finally:
        if old is None:
            os.environ.pop(DIR_ENV, None)
        else:
            os.environ[DIR_ENV] = old


def _code_rev() -> str | None:
    try:
        out = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                             timeout=10)
        return out.stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


class Run:
    """One calibration run: the model, the sets, where its caches and the draft live, the provenance it writes."""

    def __init__(self, model_path: str, kb_cache: Path, dump_dir: Path, sets: list[str], command: str,
                 base: CalibrationProfile | None = None, by_family: bool = False, weigh: str = "sets",
                 features: list[str] | None = None):
        from pipeline.models.embeddings import load_embedding

        self.model_path = model_path
        self.model_id = embedding_model_id(model_path, REPO)
        self.slug = slug(self.model_id)
        self.sets = sets
        self.by_family = by_family  # left-out metrics: a family of text left out at a time, not a set
        self.weigh = weigh          # the fusion's fit: sets or families weighing alike (fusion_cv.set_weights)
        self.features = list(features or fusion_cv.AUTO_FEATURES)  # the α model's inputs
        self.kb_root = kb_cache if self.model_id == PACKAGED_MODEL_ID else kb_cache / self.slug
        self.dumps = dump_dir / self.slug
        self.draft_dir = self.dumps / "profile"
        self.command = command
        self.date = datetime.date.today().isoformat()
        self.code = _code_rev()
        self.dim = load_embedding(model_path, REPO, REPO / "models").dim
        # `base`: the model's profile whose other sections a run of some steps keeps (their about text too)
        about = base.about if base else f"{self.model_id}: fitted by python -m tools.eval.calibrate on {', '.join(sets)}"
        self.profile = (base or generic()).model_copy(update={
            "embedding_model": self.model_id, "embedding_dim": self.dim, "about": about})
        self.save_draft()

    def provenance(self, dev_sets: list[str], left_out: dict, notes: str = "") -> Provenance:
        code = f"fitted by the code at {self.code}" if self.code else ""
        return Provenance(fitted_for=self.model_id, dev_sets=sorted(dev_sets), command=self.command, date=self.date,
                          commit=None, left_out=left_out, notes="; ".join(x for x in (notes, code) if x) or None)

    def kept(self, section, why: str):
        """The generic section, its provenance saying it was not fitted for this model and why."""
        note = f"not fitted for {self.model_id}: {why}; the generic profile's values"
        prov = section.provenance.model_copy(update={"notes": f"{note} ({section.provenance.notes})"})
        print(f"calibrate: {note}", file=sys.stderr)
        return section.model_copy(update={"provenance": prov})

    def set_section(self, name: str, section) -> None:
        self.profile = self.profile.model_copy(update={name: section})
        self.save_draft()

    def save_draft(self) -> None:
        write(CalibrationProfile.model_validate(self.profile.model_dump()), self.draft_dir / f"{self.slug}.json")

    def left_out_units(self) -> int:
        """How many units a left-out fit can leave out: families of text with --by-family, else sets."""
        return len(fusion_cv.family_groups(self.sets)) if self.by_family else len(self.sets)

    @property
    def unit(self) -> str:
        return "family" if self.by_family else "set"

    def step_dir(self, name: str, fresh: bool = True) -> Path:
        """The dumps of one step; `fresh`: emptied first (its dumps hold the numbers fitted before it)."""
        d = self.dumps / name
        d.mkdir(parents=True, exist_ok=True)
        if fresh:
            for f in d.iterdir():
                if f.is_file():
                    f.unlink()
        return d


# ---------------------------------------------------------------------------------------------- the steps
def build_kbs(run: Run) -> None:

    for name in run.sets:
        print(f"calibrate: knowledge base {name}: {ensure_built(run.kb_root, devset(name), run.model_path)}",
              file=sys.stderr)


def fusion_left_out(cv: dict) -> dict:
    """Per left-out set, the chosen fusion (convex min-max, auto α + prior) against its better route and RRF (and,
    left out by family, the family it was left out with)."""
    out = {}
    for name, r in cv["sets"].items():
        chosen = r["routes"][cv["chosen"]]
        best = max(("bm25", "vector"), key=lambda k: r["routes"][k]["mrr@10"])
        lp = r["fitted"][cv["chosen"]]["length_prior"]
        out[name] = {"questions": r["questions"], "mrr@10": chosen["mrr@10"], "hit@1": chosen["hit@1"],
                     "hit@5": chosen["hit@5"], "mean_alpha": chosen["mean_alpha"], "better_route": best,
                     "better_route_mrr@10": r["routes"][best]["mrr@10"],
                     "better_route_hit@1": r["routes"][best]["hit@1"], "rrf_mrr@10": r["routes"]["rrf"]["mrr@10"],
                     "rrf_hit@1": r["routes"]["rrf"]["hit@1"], "prior_cap": lp["cap"], "prior_beta": lp["beta"]}
        if "left_out_with" in r:
            out[name]["left_out_with"] = r["left_out_with"]
    avg = cv["average"]
    out["average"] = {"mrr@10": avg[cv["chosen"]]["mrr@10"], "hit@1": avg[cv["chosen"]]["hit@1"],
                      "hit@5": avg[cv["chosen"]]["hit@5"], "rrf_mrr@10": avg["rrf"]["mrr@10"],
                      "rrf_hit@1": avg["rrf"]["hit@1"]}
    return out


def fit_fusion(run: Run, redump: bool = False) -> None:

    d = run.step_dir("fusion", fresh=False)
    for name in run.sets:  # the candidate dumps do not depend on any fitted number: reused unless --redump
        path = d / f"{name}.jsonl"
        if redump or not path.exists():
            tmp = path.with_suffix(".tmp")
            evaluate_set(name, run.kb_root, {}, dump=tmp)
            tmp.rename(path)
    current = run.profile.fusion
    if run.left_out_units() < 2:
        run.set_section("fusion", run.kept(current, f"leaving one {run.unit} out needs two"))
        return
    data = {n: fusion_cv.load_dump(d / f"{n}.jsonl") for n in run.sets}
    cv = fusion_cv.cross_validate(data, adaptive=current.adaptive_rrf, weigh=run.weigh,
                                  groups=fusion_cv.family_groups(data) if run.by_family else None,
                                  names=run.features)
    fusion_cv.print_cv(cv)
    w = fusion_cv.fit_all(data, run.model_id, run.weigh, run.features)
    adaptive = current.adaptive_rrf.model_copy(update={"provenance": current.adaptive_rrf.provenance.model_copy(
        update={"notes": f"not refitted for {run.model_id} (no fitting code: chosen once on a grid for the packaged "
                         f"e5); {current.adaptive_rrf.provenance.notes}"})})
    run.set_section("fusion", FusionCalibration(
        alpha_model={n: w[n] for n in ("minmax", "zscore")}, length_prior=w["length_prior"], adaptive_rrf=adaptive,
        provenance=run.provenance(list(data), fusion_left_out(cv),
                                  f"fusion_cv.fit_all on every set, {run.weigh} weighing alike, the α model reading "
                                  f"{', '.join(run.features)}; left-out: the chosen "
                                  f"fusion ({cv['chosen']} + fragment prior), each set scored by a fit without its "
                                  f"{run.unit}")))


def gate_section(model, similarity: str = "above") -> dict:
    """A fitted gate.GateModel as the profile's `gate` fields (without provenance)."""
    return {"similarity": similarity,
            "quick": {"coef": list(model.quick_coef), "bias": model.quick_bias,
                      "refuse_below": model.quick_refuse_below, "answer_at": model.quick_answer_at},
            "full": {"coef": list(model.coef), "bias": model.bias, "refuse_below": model.refuse_below,
                     "answer_at": model.answer_at},
            "band": {"sure_refuse": model.sure_refuse, "sure_answer": model.sure_answer}}


def by_set(by_family: dict) -> dict:
    """A leave-one-family-out result ({family: {"trained_on", "sets": {set: metrics}, …}}) as metrics per set, each
    naming the family it was left out with."""
    return {name: m | {"left_out_with": fam} for fam, r in by_family.items() for name, m in r["sets"].items()}


def fit_gate(run: Run, per_set: int) -> None:
    d = run.step_dir("gate")
    questions_of = {n: load_corpus(DEV_SETS[n]).questions for n in run.sets if n in DEV_SETS}
    for name in run.sets:  # over the fusion just fitted (the gate reads the fused order): always dumped again
        if name == REGULATIONS.name:
            gate_dataset.dump_regulations(run.kb_root, d, per_set)
        else:
            gate_dataset.dump_set(name, run.kb_root, d, per_set, questions_of)
    rows, bg = cg.load(d)
    if run.left_out_units() < 2:
        run.set_section("gate", run.kept(run.profile.gate, f"leaving one {run.unit} out needs two"))
        return
    if run.by_family:
        loso = by_set(cg.leave_one_family_out(rows, bg))
    else:
        loso = cg.leave_one_set_out(rows, bg)
    cg.print_table(loso)
    model = cg.fit(rows, bg)
    left_out = {k: {m: v for m, v in r.items() if m != "model"} for k, r in loso.items()}
    run.set_section("gate", GateCalibration(**gate_section(model), provenance=run.provenance(
        list(bg), left_out, f"calibrate_gate.fit on every set, {per_set} answerable questions sampled per set; "
                            f"left-out: each set scored by a fit without its {run.unit}")))
    floor = cg.hard_floor(rows)
    run.set_section("floor", FloorCalibration(min_similarity=min(1.0, max(0.0, floor)), provenance=run.provenance(
        list(bg), {}, f"calibrate_gate.hard_floor: the {cg.FLOOR_QUANTILE:.1%} quantile of the answerable "
                      f"questions' best cosine, lowest over the sets, rounded down to 0.01 (measured {floor:.2f}); "
                      "not leave-one-set-out")))


def fit_extractive(run: Run, per_set: int) -> None:
    d = run.step_dir("extractive")
    for name in run.sets:
        extractive_dataset.dump_set(name, run.kb_root, d, per_set, None)
    sets = cx.load(d)
    if run.left_out_units() < 2:
        run.set_section("extractive", run.kept(run.profile.extractive, f"leaving one {run.unit} out needs two"))
        return
    if run.by_family:
        loso = by_set(cx.leave_one_family_out(sets))
    else:
        loso = {name: cx.metrics(data, cx.fit([x for n, x in sets.items() if n != name]))
                for name, data in sets.items()}
    cx.print_table(loso)
    p = cx.fit(list(sets.values()))
    run.set_section("extractive", ExtractiveCalibration(**p.__dict__, provenance=run.provenance(
        list(sets), loso, f"calibrate_extractive.fit on every set (w_cos fixed at {cx.W_COS:g}: only ratios matter), "
                          f"{per_set} answerable questions sampled per set; left-out: each set scored by a fit "
                          f"without its {run.unit}")))


def fit_support(run: Run, per_set: int) -> None:
    from pipeline.generation.support import SupportParams

    names = [n for n in run.sets if n in cs.SETS]  # the sets with answer strings to build claims from
    if len(names) < 2:
        run.set_section("support", run.kept(run.profile.support, f"leave-one-set-out needs two of {', '.join(cs.SETS)}"))
        return
    data = {n: cs.collect(n, run.kb_root, per_set) for n in names}
    weights = SupportParams.from_calibration(run.profile.support)  # w_cos, w_cov, w_phrase: fixed by design
    loso = {}  # one set out at a time even --by-family: every set with claims is encyclopedic
    for name, rows in data.items():
        p = cs.fit({n: r for n, r in data.items() if n != name}, weights)
        loso[name] = cs.score(rows, p) | {"floor": p.floor, "margin": p.margin, "hard_floor": p.hard_floor}
    p = cs.fit(data, weights)
    run.set_section("support", SupportCalibration(**p.__dict__, provenance=run.provenance(
        names, loso, "calibrate_support.fit on every set: floor, margin, hard_floor fitted; w_cos, w_cov, w_phrase "
                     f"fixed by design; {per_set} right and {per_set} wrong citations per set")))


STEPS = ("fusion", "gate", "extractive", "support")  # in the order their inputs need
FITS = {"gate": fit_gate, "extractive": fit_extractive, "support": fit_support}  # the sampled steps


def calibrate(model_path: str, kb_cache: Path, dump_dir: Path, sets: list[str], out: Path = PACKAGE_DIR,
              per_set: dict[str, int] | None = None, redump: bool = False, command: str | None = None,
              steps: tuple[str, ...] = STEPS, by_family: bool = False, weigh: str = "sets",
              features: list[str] | None = None) -> Path:
    """The whole fit for one embedding model, or only `steps` of it; returns the profile file written
    (<out>/<slug>.json). With only some steps, every other section stays as the model's profile in `out` (or the
    one the app reads for it) has it; a later step reads the sections before it, so a refit of one step keeps
    the others' numbers — and what they were fitted on — as they were. `by_family`: left-out metrics by family of
    text; `weigh`: "sets" or "families" weighing alike in the fusion's fit; `features`: the α model's inputs."""

    unknown = [s for s in sets if s not in SETS]
    if unknown:
        raise ValueError(f"unknown dev set(s) {', '.join(unknown)}; known: {', '.join(SETS)}")
    fusion_cv.set_weights(sets, weigh)  # an unknown `weigh` fails here, before any knowledge base is built
    if features is not None:
        fusion_cv.check_features(features)
    if not steps or set(steps) - set(STEPS):
        raise ValueError(f"steps {', '.join(steps)}: each one of {', '.join(STEPS)}")
    sizes = PER_SET | (per_set or {})
    command = command or "python -m tools.eval.calibrate " + shlex.join(
        ["--embedding-model", model_path or "packaged", "--sets", ",".join(sets)]
        + (["--steps", ",".join(steps)] if tuple(steps) != STEPS else []) + (["--by-family"] if by_family else [])
        + (["--weigh", weigh] if weigh != "sets" else []) + (["--features", ",".join(features)] if features else []))
    base = None
    if tuple(steps) != STEPS:
        model_id = embedding_model_id(model_path, REPO)
        existing = Path(out) / f"{slug(model_id)}.json"
        base = read(existing) if existing.is_file() else profile_for(model_id).profile
    run = Run(model_path, Path(kb_cache), Path(dump_dir), list(sets), command, base, by_family, weigh, features)
    with searched_first(run.draft_dir):
        build_kbs(run)
        for step in (s for s in STEPS if s in steps):
            if step == "fusion":
                fit_fusion(run, redump)
            else:
                FITS[step](run, sizes[step])
    path = write(CalibrationProfile.model_validate(run.profile.model_dump()), Path(out) / f"{run.slug}.json")
    print(f"calibrate: wrote {path}", file=sys.stderr)
    return path


def main(argv=None) -> int:

    ap = command_parser("tools.eval.calibrate", __doc__)
    ap.add_argument("--embedding-model", required=True,
                    help="the model folder (with config.json); 'packaged' for the packaged multilingual-e5-small")
    add_kb_cache(ap)
    ap.add_argument("--dump-dir", default=None, help="where the per-step dumps and the draft profile go "
                                                     "(default: a temporary folder)")
    ap.add_argument("--sets", default=",".join(DEV_SETS),
                    help=f"comma-separated dev sets (default: the five of DEV_SETS; known: {', '.join(SETS)})")
    ap.add_argument("--out", type=Path, default=PACKAGE_DIR, help="folder of the profile (default: pipeline/calibration)")
    ap.add_argument("--redump", action="store_true", help="run the fusion's retrieval dumps again even if present")
    ap.add_argument("--steps", default=",".join(STEPS),
                    help="comma-separated steps to fit (default: all); the other sections stay as the model's "
                         "profile has them")
    ap.add_argument("--by-family", action="store_true",
                    help="left-out metrics leave out a family of text (tools/eval/devsets.FAMILIES), not a set")
    ap.add_argument("--weigh", default="sets", choices=("sets", "families"),
                    help="the fusion's fit: each set weighs alike (default), or each family")
    ap.add_argument("--features", default=",".join(fusion_cv.AUTO_FEATURES),
                    help="comma-separated inputs of the fusion's α model (default: all)")
    for step, n in PER_SET.items():
        ap.add_argument(f"--{step}-per-set", type=int, default=n, help=f"questions sampled per set for the {step} fit")
    args = ap.parse_args(argv)
    features = fusion_cv.parse_features(ap, args.features)
    root = kb_cache_root(ap, args)
    model = "" if args.embedding_model == "packaged" else args.embedding_model
    if model and embedding_model_id(model, REPO) == PACKAGED_MODEL_ID:
        ap.error(f"--embedding-model {model}: no model folder (config.json) there")
    sizes = {step: getattr(args, f"{step}_per_set") for step in PER_SET}
    command = "python -m tools.eval.calibrate " + shlex.join(argv if argv is not None else sys.argv[1:])
    with contextlib.ExitStack() as stack:
        dump_dir = Path(args.dump_dir) if args.dump_dir else Path(stack.enter_context(
            tempfile.TemporaryDirectory(prefix="kbqa-calibrate-")))
        calibrate(model, root, dump_dir, [s for s in args.sets.split(",") if s], args.out, sizes, args.redump,
                  command, tuple(s for s in args.steps.split(",") if s), args.by_family, args.weigh, features)
    return 0


if __name__ == "__main__":
    sys.exit(main())
