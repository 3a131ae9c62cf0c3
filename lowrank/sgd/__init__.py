"""Part II: SGD with weight decay trains low-rank networks (Galanti, Siegel, Gupte, Poggio).

- `theory`: Lemma 3.1 (per-sample gradient ranks against the patch count N) and Theorem 3.2 (the
  distance of W_t to rank N B k, checked along plain SGD, with negative controls; `bound_regime`, what
  the bound can say before training).
- `ranks`: average ranks over the layers the authors count; the experiment the batch-size,
  learning-rate and weight-decay pages share (`rank_experiment`: a grid x seeds trained as batched
  ensembles, its regime `accumulated_weight_decay` computed before training, `pooled_trend` with a
  permutation null, `batch_effect_ratio`); the rank bound N B log(1/eps)/(2 mu lambda).
- `noise`: the SGD-noise page's classification of runs (collapsed, still moving).
"""
