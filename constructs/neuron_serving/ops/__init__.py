"""The commands of the ``neuron-serving`` CLI, one module each with a ``register()``: ``plan`` (the
plan layer's layouts and predictions, no AWS), ``api-key``, ``preflight``, ``status``, ``logs``,
``smoke`` and ``bench`` (with boto3, or against a deployed endpoint), on the shared pieces of
:mod:`.aws` (calls whose failures become sentences) and :mod:`.output` (tables, progress and
``--output json``). Only :mod:`neuron_serving.cli` imports this package; the CDK constructs never do."""
