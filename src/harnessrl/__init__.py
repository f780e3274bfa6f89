"""harnessrl: evaluate, diagnose, improve and train one LLM agent across many harnesses."""

__version__ = "0.1.0"
