"""One layer's measures against the loop oracles, and the certificates at their last ulp."""
