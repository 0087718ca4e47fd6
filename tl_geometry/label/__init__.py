"""Labelling heads: the Retriever / Mixer / Reset taxonomy from votes, and TransformerLens's head types."""
