"""The MLP density a threshold method (TEAL, CATS) actually reads on the evaluation text.

Thresholds are fitted so each layer keeps its share *in expectation on calibration text*; on other text
the share moves, so comparing TEAL or CATS with DIP at equal ρ (docs/method.md, "MLP density": bytes read
per token) needs the share they realise on the very tokens they are scored on. DIP's top-K reads exactly
its plan's density on every token.

And how well a top-K method's GLU selection recalls the units the dense computation would rank first
(:class:`RecallMeter`): the measure of the predictor baseline beside DIP.
"""

from __future__ import annotations

from dataclasses import replace

from dipdeploy.sparsity.methods import sparse_mlps
from dipdeploy.sparsity.plan import LayerPlan, SparsityPlan

#: What each threshold method's observer reports, and the plan threshold that name is compared with.
_THRESHOLDS = {"in": "thr_in", "glu": "thr_glu", "gate": "thr_glu"}


class DensityMeter:
    """Counts, per layer and group, the magnitudes above the layer's threshold while a model runs.

    Installed as the sparse MLPs' observer (``methods.SparseMLP.observe``), which TEAL and CATS call with
    the very magnitudes they threshold."""

    def __init__(self, model, plan: SparsityPlan):
        self.plan = plan
        self.kept: dict[tuple[int, str], float] = {}
        self.seen: dict[tuple[int, str], int] = {}
        self.mlps = sparse_mlps(model)

    def __enter__(self) -> "DensityMeter":
        for m in self.mlps:
            m.observer = self._count
        return self

    def __exit__(self, *exc) -> None:
        for m in self.mlps:
            m.observer = None

    def _count(self, i: int, name: str, t) -> None:
        thr = getattr(self.plan.layers[i], _THRESHOLDS[name])
        key = (i, name)
        self.kept[key] = self.kept.get(key, 0.0) + float((t > thr).sum())
        self.seen[key] = self.seen.get(key, 0) + t.numel()

    def density(self) -> float:
        """The realised mean MLP density: the plan's own formula (``SparsityPlan.layer_density``) on the
        realised shares in place of K/d and K/F."""
        d, f = self.plan.hidden_size, self.plan.intermediate_size

        def share(i: int, name: str) -> float:
            return self.kept[(i, name)] / self.seen[(i, name)] if (i, name) in self.seen else 1.0

        glu = "glu" if self.plan.method == "teal" else "gate"
        layers = [LayerPlan(share(i, "in") * d, share(i, glu) * f) for i in range(len(self.plan.layers))]
        return replace(self.plan, layers=layers).mean_density()


#: Methods whose GLU selection is a top-K_glu per token, so their recall of the dense GLU's top-K is defined.
RECALL_METHODS = ("glu", "dip", "dip-ca", "predictor")


class RecallMeter:
    """Per layer, the share of the true top-K_glu GLU units (by |GLU| of the dense computation, K the
    layer's own) that a top-K method chose, over every token the model runs while installed as the sparse
    MLPs' ``recall`` (``methods.SparseMLP.note_recall``). The predictor baseline's premise is measured by
    it (docs/method.md, "The predictor baseline")."""

    def __init__(self, model):
        self.mlps = sparse_mlps(model)
        self.hits: dict[int, int] = {}
        self.wanted: dict[int, int] = {}

    def __enter__(self) -> "RecallMeter":
        for m in self.mlps:
            m.recall = self._count
        return self

    def __exit__(self, *exc) -> None:
        for m in self.mlps:
            m.recall = None

    def _count(self, i: int, hits: int, wanted: int) -> None:
        self.hits[i] = self.hits.get(i, 0) + hits
        self.wanted[i] = self.wanted.get(i, 0) + wanted

    def layers(self) -> list[float]:
        """Each layer's recall in [0, 1], in layer order."""
        return [self.hits[i] / self.wanted[i] for i in sorted(self.wanted) if self.wanted[i]]

    def recall(self) -> float | None:
        """The layers' recalls averaged (None when nothing was counted)."""
        per = self.layers()
        return sum(per) / len(per) if per else None
