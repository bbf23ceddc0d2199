"""Similar: near-duplicate search over the stored perceptual hashes, and the ``dups`` command's library."""
