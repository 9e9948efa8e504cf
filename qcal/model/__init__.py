"""Model plumbing: architecture specs, loading, capture hooks, the layer-wise driver."""
