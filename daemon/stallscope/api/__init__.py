"""gRPC transport (see protos/): the servicer, the client, and the conversions
between protobuf messages and what the layers below produce. It translates and
never decides: SQL runs in `analysis.sandbox`, live events come from the
store's listeners, diagnosis windows and exports from the service."""
