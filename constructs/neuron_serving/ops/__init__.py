"""The operator's commands of the ``neuron-serving`` CLI that talk to AWS (with boto3) or to a
deployed endpoint: ``preflight``, ``status``, ``logs`` and ``smoke``, on the shared pieces of
:mod:`.aws` (calls whose failures become sentences) and :mod:`.output` (tables, progress and
``--output json``). Nothing here is imported by the CDK constructs."""
