"""Reading a model or a cache: hooks into per-layer attention (every TransformerLens version and
model class differs only here), the hook plumbing of interventions, the bundled models and corpora."""
