# Generates C++ (and gRPC) code for proto/circuitlab/v1 and defines:
#   circuitlab_proto       messages only (libprotobuf); the engine may use these
#   circuitlab_proto_grpc  service stubs (grpc++); only server/rpc and client/ link it
# grpc/health/v1 is the standard health protocol (clients only: the server uses
# gRPC's built-in health service).
set(CIRCUITLAB_PROTO_ROOT ${PROJECT_SOURCE_DIR}/proto)
set(CIRCUITLAB_PROTO_FILES
    circuitlab/v1/spec.proto
    circuitlab/v1/experiment_service.proto
    circuitlab/v1/analysis_service.proto
    circuitlab/v1/worker_service.proto
    circuitlab/v1/reproduce.proto
    grpc/health/v1/health.proto)
set(CIRCUITLAB_GRPC_SERVICES
    circuitlab/v1/experiment_service.proto
    circuitlab/v1/analysis_service.proto
    circuitlab/v1/worker_service.proto
    circuitlab/v1/reproduce.proto
    grpc/health/v1/health.proto)
set(_gen ${PROJECT_BINARY_DIR}/gen)
file(MAKE_DIRECTORY ${_gen})

find_program(GRPC_CPP_PLUGIN grpc_cpp_plugin REQUIRED)

set(_msg_srcs)
set(_grpc_srcs)
foreach(proto ${CIRCUITLAB_PROTO_FILES})
  string(REGEX REPLACE "\\.proto$" "" base ${proto})
  set(outs ${_gen}/${base}.pb.cc ${_gen}/${base}.pb.h)
  set(args --cpp_out=${_gen})
  if(proto IN_LIST CIRCUITLAB_GRPC_SERVICES)
    list(APPEND outs ${_gen}/${base}.grpc.pb.cc ${_gen}/${base}.grpc.pb.h)
    list(APPEND args --grpc_out=${_gen} --plugin=protoc-gen-grpc=${GRPC_CPP_PLUGIN})
    list(APPEND _grpc_srcs ${_gen}/${base}.grpc.pb.cc)
  endif()
  list(APPEND _msg_srcs ${_gen}/${base}.pb.cc)
  add_custom_command(
    OUTPUT ${outs}
    COMMAND protobuf::protoc ${args} -I ${CIRCUITLAB_PROTO_ROOT} ${CIRCUITLAB_PROTO_ROOT}/${proto}
    DEPENDS ${CIRCUITLAB_PROTO_ROOT}/${proto} protobuf::protoc
    COMMENT "protoc ${proto}"
    VERBATIM)
endforeach()

add_library(circuitlab_proto STATIC ${_msg_srcs})
target_include_directories(circuitlab_proto PUBLIC ${_gen})
target_link_libraries(circuitlab_proto PUBLIC protobuf::libprotobuf)

add_library(circuitlab_proto_grpc STATIC ${_grpc_srcs})
target_link_libraries(circuitlab_proto_grpc PUBLIC circuitlab_proto gRPC::grpc++)
