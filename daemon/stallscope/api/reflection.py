"""Server reflection under both names clients ask for: grpc.reflection.v1 and v1alpha.

grpcio-reflection ships only `grpc.reflection.v1alpha`; current clients
(grpcurl, Postman, @grpc/reflection, grpc-java) ask for `grpc.reflection.v1`
first. The two protocols are the same messages under another package name
(same fields, same numbers), so the v1 service here is the v1alpha servicer
behind a second method name, and its descriptor is v1alpha's file with the
package renamed, added to the default pool so reflection can describe
itself under both names. It never changes what v1alpha answers.
"""

import grpc
from google.protobuf import descriptor_pb2, descriptor_pool
from grpc_reflection.v1alpha import reflection as reflection_v1alpha
from grpc_reflection.v1alpha import reflection_pb2 as v1alpha_pb2

V1ALPHA_SERVICE_NAME = reflection_v1alpha.SERVICE_NAME  # grpc.reflection.v1alpha.ServerReflection
V1_SERVICE_NAME = "grpc.reflection.v1.ServerReflection"
_V1_FILE = "grpc/reflection/v1/reflection.proto"


def _add_v1_descriptor(pool):
    """v1alpha's reflection.proto renamed to grpc.reflection.v1, once per pool."""
    try:
        pool.FindFileByName(_V1_FILE)
        return
    except KeyError:
        pass
    proto = descriptor_pb2.FileDescriptorProto()
    v1alpha_pb2.DESCRIPTOR.CopyToProto(proto)
    proto.name = _V1_FILE
    proto.package = "grpc.reflection.v1"
    old, new = ".grpc.reflection.v1alpha.", ".grpc.reflection.v1."
    for message in proto.message_type:
        for field in message.field:
            if field.type_name.startswith(old):
                field.type_name = new + field.type_name[len(old) :]
    for service in proto.service:
        for method in service.method:
            method.input_type = new + method.input_type[len(old) :]
            method.output_type = new + method.output_type[len(old) :]
    proto.ClearField("options")  # v1alpha's go_package and the like
    pool.Add(proto)


def enable_server_reflection(service_names, server):
    """Serve reflection for `service_names` (plus both reflection services)."""
    pool = descriptor_pool.Default()
    _add_v1_descriptor(pool)
    names = tuple(service_names) + (V1ALPHA_SERVICE_NAME, V1_SERVICE_NAME)
    servicer = reflection_v1alpha.ReflectionServicer(names, pool=pool)
    reflection_v1alpha.enable_server_reflection(names, server, pool=pool)
    handler = grpc.stream_stream_rpc_method_handler(
        servicer.ServerReflectionInfo,
        request_deserializer=v1alpha_pb2.ServerReflectionRequest.FromString,
        response_serializer=v1alpha_pb2.ServerReflectionResponse.SerializeToString,
    )
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler(V1_SERVICE_NAME, {"ServerReflectionInfo": handler}),)
    )
    return names
