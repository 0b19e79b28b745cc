"""cdk-neuron-serving: serve LLMs on AWS Inferentia2 and Trainium with data-parallel TGI replicas."""
