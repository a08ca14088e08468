"""Slips for chapter 6 (the value loss: detached target, clipping, token weights, masked statistics)."""
from mutations import Slip

CHAPTER = "06_value_loss.ipynb"
# the code cells that prove each general proposition (the instance checks after them are not listed)
PROOFS = {
    "prop-vloss-detach": (8,),
    "prop-vloss-clip-gradient": (12,),
    "prop-vloss-token-weights": (27,),
}
MUTATIONS = [
    Slip(name="proof-no-stop-gradient", aims_at="prop-vloss-detach", cell=8,
         old="(v - g(w)) ** 2, v)", new="(v - g(v)) ** 2, v)",
         why="the 'detached' target of the proof built from the live value"),
    Slip(name="library-no-detach", aims_at=10, function="valuelab.losses:value_loss",
         old='returns = check_like(returns, "returns", values, "values").detach()',
         new='returns = check_like(returns, "returns", values, "values")',
         why="value_loss lets the gradient flow through its target"),
    Slip(name="proof-optimistic-clip", aims_at="prop-vloss-clip-gradient", cell=12,
         old="loss_clip = sp.Rational(1, 2) * sp.Max(", new="loss_clip = sp.Rational(1, 2) * sp.Min(",
         why="the clipped loss with the minimum of the two terms (as in the policy objective)"),
    Slip(name="library-optimistic-clip", aims_at=18, function="valuelab.losses:value_loss",
         old="sq = torch.maximum(sq, _valid(clipped - returns, m) ** 2)",
         new="sq = torch.minimum(sq, _valid(clipped - returns, m) ** 2)",
         why="value_loss takes the smaller of the clipped and unclipped errors"),
    Slip(name="library-clip-bound-halved", aims_at=40, function="valuelab.losses:value_loss",
         old="(values - old).clamp(-c, c)", new="(values - old).clamp(-c / 2, c / 2)",
         why="the clip range read as the band's full width, not its half-width"),
    Slip(name="proof-seq-mean-no-length", aims_at="prop-vloss-token-weights", cell=27,
         old='"seq-mean-token-mean": half * sp.Sum(per_seq_sum / Lb[bb], (bb, 1, B)) / B',
         new='"seq-mean-token-mean": half * sp.Sum(per_seq_sum, (bb, 1, B)) / B',
         why="the per-sequence mean without its 1/L_b"),
    Slip(name="library-seq-mean-padded-width", aims_at=29, function="valuelab.losses:_aggregate",
         old="per_seq = per_seq / m.sum(-1).clamp(min=1)", new="per_seq = per_seq / m.shape[-1]",
         why="each sequence divided by the padded width instead of its length (wrong token weight)"),
    Slip(name="library-token-mean-over-padding", aims_at=29, function="valuelab.losses:_aggregate",
         old="return (x * m).sum() / m.sum().clamp(min=1)", new="return (x * m).sum() / m.numel()",
         why="token-mean divided by every slot, padding included"),
    Slip(name="whiten-biased-variance", aims_at=40, function="valuelab.losses:_whiten_everywhere",
         old="/ (count - 1)", new="/ count",
         why="the biased variance in the masked whitening"),
    Slip(name="masked-mean-over-padding", aims_at=35, function="valuelab.losses:masked_mean",
         old="out = s * ((xw / s) * mw).sum() / mw.sum().clamp(min=1)",
         new="out = s * ((xw / s) * mw).sum() / mw.numel()",
         why="the masked mean divided by the padded size"),
]
