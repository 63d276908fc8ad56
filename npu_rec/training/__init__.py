"""Training decisions both front ends share: step settings, save/evict policies, precision."""
