"""Reading models and caches on every TransformerLens version and model class."""
