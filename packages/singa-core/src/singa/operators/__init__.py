"""The autograd operators of `singa.autograd`, one module per family (`singa.autograd` re-exports every name):
`unary`, `binary`, `linalg`, `shape`, `reduce`, `indexing`, `nn` and `loss`; the engine they build on is
`singa.autograd_engine`."""
