#include "server/rpc/service_util.h"

#include <google/protobuf/io/coded_stream.h>
#include <google/protobuf/unknown_field_set.h>
#include <grpcpp/support/proto_buffer_reader.h>

#include "server/common/text.h"

namespace circuitlab::rpc {
namespace {

std::string Metadata(const grpc::CallbackServerContext* ctx, const std::string& key) {
  const auto& md = ctx->client_metadata();
  auto it = md.find(key);
  return it == md.end() ? std::string() : std::string(it->second.data(), it->second.size());
}

}  // namespace

absl::StatusOr<Caller> Authenticate(const Security& security, const grpc::CallbackServerContext* ctx, bool workers) {
  bool tls = false;
  if (std::shared_ptr<const grpc::AuthContext> auth = ctx->auth_context()) {
    for (const grpc::string_ref& v : auth->FindPropertyValues("transport_security_type")) {
      // "tls" from gRPC's TLS credentials, "ssl" from its older SSL ones.
      const std::string type(v.data(), v.size());
      tls = tls || type == "tls" || type == "ssl";
    }
  }
  absl::StatusOr<Caller> caller =
      security.Authenticate(Metadata(ctx, "authorization"), ctx->peer(), tls, Metadata(ctx, "x-circuitlab-client"));
  if (caller.ok() && !workers) {
    if (absl::Status s = security::MayUseResearchSurface(caller->principal); !s.ok()) return s;
  }
  return caller;
}

grpc::Status ToGrpcStatus(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(status.code()),
                      Clip(std::string(status.message()), kMaxStatusMessage));
}

std::string FirstUnknownField(const google::protobuf::Message& m, const std::string& path) {
  const google::protobuf::Reflection* r = m.GetReflection();
  const google::protobuf::UnknownFieldSet& unknown = r->GetUnknownFields(m);
  if (!unknown.empty()) {
    return "field " + std::to_string(unknown.field(0).number()) + (path.empty() ? "" : " of " + path);
  }
  std::vector<const google::protobuf::FieldDescriptor*> fields;
  r->ListFields(m, &fields);
  for (const google::protobuf::FieldDescriptor* f : fields) {
    if (f->cpp_type() != google::protobuf::FieldDescriptor::CPPTYPE_MESSAGE) continue;
    const std::string sub = path.empty() ? f->name() : path + "." + f->name();
    if (f->is_repeated()) {
      for (int i = 0; i < r->FieldSize(m, f); ++i) {
        std::string found = FirstUnknownField(r->GetRepeatedMessage(m, f, i), sub + "[" + std::to_string(i) + "]");
        if (!found.empty()) return found;
      }
    } else if (std::string found = FirstUnknownField(r->GetMessage(m, f), sub); !found.empty()) {
      return found;
    }
  }
  return "";
}

absl::Status ParseRequest(const grpc::ByteBuffer& in, google::protobuf::Message* req) {
  grpc::ProtoBufferReader reader(const_cast<grpc::ByteBuffer*>(&in));
  google::protobuf::io::CodedInputStream stream(&reader);
  if (!req->ParseFromCodedStream(&stream) || !stream.ConsumedEntireMessage()) {
    return absl::InvalidArgumentError("the request is not a valid " + req->GetDescriptor()->full_name() +
                                      " message (truncated, malformed, or a string field holding invalid UTF-8)");
  }
  if (const std::string unknown = FirstUnknownField(*req); !unknown.empty()) {
    return absl::InvalidArgumentError("the request holds " + unknown + ", unknown to this server's " +
                                      req->GetDescriptor()->full_name() + " (a newer client? upgrade the server)");
  }
  return absl::OkStatus();
}

grpc::Status WriteResponse(const google::protobuf::Message& resp, grpc::ByteBuffer* out) {
  std::string bytes;
  if (!resp.SerializeToString(&bytes)) {
    return grpc::Status(grpc::StatusCode::INTERNAL, "cannot serialize the " + resp.GetDescriptor()->full_name());
  }
  grpc::Slice slice(std::move(bytes));
  *out = grpc::ByteBuffer(&slice, 1);
  return grpc::Status::OK;
}

void FinishWithin(grpc::ServerUnaryReactor* reactor, const absl::Status& s, const google::protobuf::Message& resp,
                  grpc::ByteBuffer* out) {
  if (!s.ok()) {
    reactor->Finish(ToGrpcStatus(s));
    return;
  }
  absl::StatusOr<ResponseBudget::Lease> lease = ResponseBudget::Process().Acquire(
      static_cast<int64_t>(resp.ByteSizeLong()), std::string(resp.GetDescriptor()->name()));
  if (!lease.ok()) {
    reactor->Finish(ToGrpcStatus(lease.status()));
    return;
  }
  // Serialized into gRPC's buffer; the lease ends as gRPC takes it over.
  reactor->Finish(WriteResponse(resp, out));
}

SlowCalls::SlowCalls(int threads, size_t max_waiting) : max_waiting_(max_waiting) {
  for (int i = 0; i < threads; ++i) threads_.emplace_back([this] { Work(); });
}

SlowCalls::~SlowCalls() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  for (std::thread& t : threads_) t.join();
}

bool SlowCalls::Run(std::function<void()> call) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (queue_.size() >= max_waiting_) return false;
    queue_.push_back(std::move(call));
  }
  cv_.notify_one();
  return true;
}

void SlowCalls::Work() {
  for (;;) {
    std::function<void()> call;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [this] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stopping, and nothing left
      call = std::move(queue_.front());
      queue_.pop_front();
    }
    call();
  }
}

}  // namespace circuitlab::rpc
