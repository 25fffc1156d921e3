"""The models every lecture trains or sizes: toy MLPs, the tiny LM, Llama's shapes.

Lectures 1-12 train or size these; each is built the same, from a seed, on every rank and in
the one-process reference. Modules:

* :mod:`~course_utils.models.toy`: the one builder of the small Linear stacks (``toy_mlp``)
  and its seeding for any module (``seeded``, ``ACTIVATIONS``); data parallelism (2, a10),
  ZeRO (3), the pipeline (5), memory (1, 9) and checkpointing (12) build theirs with it.
* :mod:`~course_utils.models.tiny_lm`: a GPT-shaped causal LM and the Markov-chain text it
  learns (``TinyLMConfig``, ``TinyLM``, ``MarkovCorpus``, ``build``, ``lm_loss``,
  ``shard_batch``, ``count_params``, ``predicted_param_count``, ``uniform_loss``): lectures 7,
  9 and 10 train it.
* :mod:`~course_utils.models.llama_shapes`: Llama-shaped transformers on the meta device, the
  models lecture 11 shards at scale (``Shape``, ``SHAPES``, ``shape``, ``param_count``,
  ``layer_params``, ``SPLITS``, ``stage_layers``, ``Block``, ``StageModel``, ``build``,
  ``TP_PLANS``, ``apply_tp``).
"""

