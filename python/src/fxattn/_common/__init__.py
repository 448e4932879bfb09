"""What every operator of the package shares: operands of numpy arrays and
torch tensors (arrays), argument checks (validate), and the cached
contexts with their plans (context)."""
