"""The few defaults that several stages' configs share, each written once here (docs/design.md §1).

Every other default lives in the dataclass of the stage that owns the concept (``SparsityConfig``:
γ, policy, cache fraction; ``EngineConfig``: DRAM budget, context; ``LoraConfig``: rank; …) and
is read from there by the CLI and by other configs. Only what no single stage owns is here: the model
every command loads when none is named, the MLP density a plan is made for when none is asked (every
stage's ``SparsityConfig``, so ``export`` ships the density ``eval`` measures), and the calibration text
a plan is fitted on, which ``eval``,
``calibrate``, ``trace``, ``finetune`` and ``export`` all use, so that ``calibrate`` then ``eval --plan``
gives the plan ``eval`` calibrates itself; and how a quantised model's token embedding is stored, which
``export`` ships and ``eval --quant`` must measure alike. Floor 1: no imports.
"""

#: The embedded default model (a registry name; README, "Quickstart").
MODEL = "smollm2-135m"
#: The MLP density ρ of a plan when none is asked (``SparsityConfig.density``: ``export``, ``eval``,
#: ``calibrate``, ``trace``, ``finetune``, the demo). A product default, chosen on the default model by
#: what a user sees: the smallest density whose greedy answers to everyday questions end without looping
#: and are right wherever the dense model's are, at a small perplexity cost against dense
#: (docs/decisions/0009-default-density.md; benchmarks/results/default-density-smollm2-135m.md). A bundle
#: below it passes validation and still answers badly; research comparisons name their densities.
DENSITY = 0.7
#: Calibration text: this many windows of this many tokens of the WikiText-2 validation split.
CALIB_WINDOWS = 4
CALIB_SEQLEN = 512
#: A calibrated quantiser's statistics (vq3's Hessian and error feedback; ``quantize``, ``eval --quant``,
#: ``export --quant``): this many windows of CALIB_SEQLEN tokens of the same text. More than a plan needs:
#: the down group's Hessian is F × F, and CALIB_WINDOWS windows left SmolLM2's VQ3 + DIP perplexity well
#: above what these give (benchmarks/results/quant-smollm2.md).
STATS_WINDOWS = 16
#: Tokens a completion generates when none is asked: ``run``, ``inspect --prompt`` and the Android engine's
#: ``Cli`` (android_demo/engine/…/Defaults.java, generated from this file by android_demo/make_defaults.py).
MAX_NEW_TOKENS = 64
#: Tokens of one chat answer at most: ``chat``, ``Chat.say`` and the Android app.
CHAT_MAX_NEW_TOKENS = 128
#: The token embedding of a quantised model: int4 blocks (``export --embedding``, ``eval --embedding``), or fp32.
EMBEDDINGS = ("int4", "fp32")
EMBEDDING = "int4"
#: The bits of a quantised model's dense weights (attention, lm_head; ``export --dense-bits``, ``eval
#: --dense-bits``): ``auto`` keeps the source GGUF's precision (8 bits where it stored more than 4.5
#: bits per weight, ``quant.dense``), ``4`` or ``8`` for every one. The default is ``4``: onnxruntime's CPU
#: MatMulNBits has no fast 8-bit kernel at accuracy level 0, the default level (dense-bits-smollm2.md,
#: "Speed of an 8-bit MatMulNBits").
DENSE_BITS_CHOICES = ("auto", "4", "8")
DENSE_BITS = "4"
