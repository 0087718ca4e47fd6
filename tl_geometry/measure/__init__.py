"""Measuring one layer's tensors: query rows, the selection rule, separability (torch and the
compiled engine), the random baseline, the sink, the regime fit with its certificates, winner-source
votes, and the layer pass that composes them."""
