"""gRPC API (see protos/)."""
