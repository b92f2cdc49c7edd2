// Security on a real server: TLS and mutual TLS with certificates made by
// scripts/dev-certs.sh (openssl), principals and roles from a tokens file,
// ownership, per-principal quotas, private runs, the audit log, reflection.
#include <gtest/gtest.h>
#include <grpcpp/create_channel.h>
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/security/credentials.h>
#include <grpcpp/support/byte_buffer.h>
#include <httplib.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <future>
#include <thread>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "tests/integration/integration_util.h"

namespace circuitlab::testing {
namespace {

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// "name role sha256:<digest of token>" with the token "tok-<name>-0123456789".
std::string Token(const std::string& name) { return "tok-" + name + "-0123456789"; }
std::string Principal(const std::string& name, const std::string& role, const std::string& extra = "") {
  return name + " " + role + " " + security::TokenDigestField(Token(name)) + " " + extra + "\n";
}

// Two throwaway CAs (the right one and a stranger), made once.
class Certs {
 private:
  TempDir dir_;  // first: the paths below are inside it

 public:
  static const Certs& Get() {
    static const Certs* certs = new Certs();
    return *certs;
  }
  const std::string good = dir_.path() + "/good", other = dir_.path() + "/other";

 private:
  Certs() {
    for (const std::string& d : {good, other}) {
      const std::string cmd = std::string(CIRCUITLAB_SCRIPTS_DIR) + "/dev-certs.sh " + d + " > /dev/null";
      EXPECT_EQ(std::system(cmd.c_str()), 0) << cmd;
    }
  }
};

client::Client TlsClient(const std::string& address, const std::string& ca_dir, const std::string& token = "",
                         bool client_cert = false) {
  client::ClientOptions opts;
  opts.server = address;
  opts.timeout = std::chrono::seconds(10);
  opts.token = token;
  opts.ca_cert_pem = ReadFile(ca_dir + "/ca.pem");
  if (client_cert) {
    opts.client_cert_pem = ReadFile(ca_dir + "/client.pem");
    opts.client_key_pem = ReadFile(ca_dir + "/client.key");
  }
  return client::Client(opts);
}

// A tokens file and the authenticator reading it.
struct Principals {
  explicit Principals(const std::string& dir, const std::string& lines, Quotas* quotas = nullptr)
      : path(dir + "/tokens.txt") {
    std::ofstream(path) << lines;
    auto created = security::Authenticator::Create(path, "", quotas);
    EXPECT_TRUE(created.ok()) << created.status();
    auth = std::move(*created);
  }
  std::string path;
  std::unique_ptr<security::Authenticator> auth;
};

TEST(SecurityTest, TlsRefusesPlaintextAndAStrangeCa) {
  const Certs& certs = Certs::Get();
  TempDir dir;
  FakeExecutor exec;
  Principals principals(dir.path(), Principal("alice", "user"));
  app::FrontOptions opts;
  opts.tls = {certs.good + "/server.pem", certs.good + "/server.key", "", 10};
  Server server(dir.path(), &exec, {}, opts, nullptr, principals.auth.get());

  auto plaintext = MakeClient(server.address(), Token("alice"), /*wait_for_ready=*/false);
  EXPECT_EQ(plaintext.Health().code(), absl::StatusCode::kUnavailable) << "plaintext to a TLS port";
  auto stranger = TlsClient(server.address(), certs.other, Token("alice"));
  EXPECT_EQ(stranger.Health().code(), absl::StatusCode::kUnavailable) << "a certificate from another CA";
  auto good = TlsClient(server.address(), certs.good, Token("alice"));
  ASSERT_TRUE(good.Health().ok());
  auto me = good.WhoAmI();
  ASSERT_TRUE(me.ok()) << me.status();
  EXPECT_EQ(me->principal(), "alice");
  EXPECT_EQ(me->role(), "user");
  EXPECT_TRUE(me->tls());
  EXPECT_EQ(TlsClient(server.address(), certs.good).ListRuns({}).status().code(), absl::StatusCode::kUnauthenticated)
      << "TLS does not replace the token";
}

// Kubernetes' gRPC probes speak neither TLS nor tokens: a second port serves
// health alone, in plaintext, and follows the main port's serving state.
TEST(SecurityTest, AHealthOnlyPortForProbes) {
  const Certs& certs = Certs::Get();
  TempDir dir;
  FakeExecutor exec;
  Principals principals(dir.path(), Principal("alice", "user"));
  app::FrontOptions opts;
  opts.tls = {certs.good + "/server.pem", certs.good + "/server.key", "", 10};
  opts.health_listen = "127.0.0.1:0";
  Server server(dir.path(), &exec, {}, opts, nullptr, principals.auth.get());
  ASSERT_GT(server.app().health_port(), 0);
  auto probe = MakeClient("127.0.0.1:" + std::to_string(server.app().health_port()));
  EXPECT_TRUE(probe.Health().ok());
  EXPECT_EQ(probe.ListRuns({}).status().code(), absl::StatusCode::kUnimplemented) << "no data on the probe port";
  EXPECT_EQ(MakeClient("127.0.0.1:" + std::to_string(server.app().health_port()), Token("alice"))
                .ListRuns({})
                .status()
                .code(),
            absl::StatusCode::kUnimplemented);
  EXPECT_EQ(ListServicesByReflection("127.0.0.1:" + std::to_string(server.app().health_port()), Token("alice"))
                .status()
                .code(),
            absl::StatusCode::kUnimplemented);
  server.app().MarkNotServing();
  EXPECT_EQ(probe.Health().code(), absl::StatusCode::kUnavailable) << "NOT_SERVING while draining";
}

TEST(SecurityTest, MutualTlsRequiresAClientCertificate) {
  const Certs& certs = Certs::Get();
  TempDir dir;
  FakeExecutor exec;
  Principals principals(dir.path(), Principal("alice", "user"));
  app::FrontOptions opts;
  opts.tls = {certs.good + "/server.pem", certs.good + "/server.key", certs.good + "/ca.pem", 10};
  Server server(dir.path(), &exec, {}, opts, nullptr, principals.auth.get());
  EXPECT_EQ(TlsClient(server.address(), certs.good, Token("alice")).Health().code(), absl::StatusCode::kUnavailable);
  EXPECT_TRUE(TlsClient(server.address(), certs.good, Token("alice"), /*client_cert=*/true).ListRuns({}).ok());
}

// Replaced certificate files apply to new connections without a restart.
TEST(SecurityTest, ReplacedCertificatesApplyWithoutARestart) {
  const Certs& certs = Certs::Get();
  TempDir dir;
  FakeExecutor exec;
  for (const char* f : {"server.pem", "server.key"}) {
    std::filesystem::copy_file(certs.good + "/" + f, dir.path() + "/" + f);
  }
  Principals principals(dir.path(), Principal("alice", "user"));
  app::FrontOptions opts;
  opts.tls = {dir.path() + "/server.pem", dir.path() + "/server.key", "", 1};
  Server server(dir.path(), &exec, {}, opts, nullptr, principals.auth.get());
  ASSERT_TRUE(TlsClient(server.address(), certs.good, Token("alice")).ListRuns({}).ok());
  EXPECT_FALSE(TlsClient(server.address(), certs.other, Token("alice")).ListRuns({}).ok());
  // Key first, then certificate, each replaced whole (rename), as an operator would.
  for (const char* f : {"server.key", "server.pem"}) {
    std::filesystem::copy_file(certs.other + "/" + f, dir.path() + "/" + f + ".new");
    std::filesystem::rename(dir.path() + "/" + f + ".new", dir.path() + "/" + f);
  }
  EXPECT_TRUE(WaitFor([&] { return TlsClient(server.address(), certs.other, Token("alice")).ListRuns({}).ok(); },
                      std::chrono::seconds(10)))
      << "the new certificate is served within --tls-reload-seconds";
}

TEST(SecurityTest, InsecurePlaintextBeyondLoopbackWarnsAndHidesReflection) {
  TempDir dir;
  FakeExecutor exec;
  Principals principals(dir.path(), Principal("alice", "user"));
  app::FrontOptions opts;
  opts.insecure_plaintext = true;
  Server server(dir.path(), &exec, {}, opts, nullptr, principals.auth.get(), nullptr, "0.0.0.0:0");
  auto alice = MakeClient(server.address(), Token("alice"));
  auto me = alice.WhoAmI();
  ASSERT_TRUE(me.ok()) << me.status();
  EXPECT_FALSE(me->tls());
  EXPECT_NE(me->warning().find("without TLS (--insecure-plaintext)"), std::string::npos) << me->warning();
  EXPECT_EQ(ListServicesByReflection(server.address(), Token("alice")).status().code(),
            absl::StatusCode::kUnimplemented)
      << "no transport hook to guard it: not served";
  EXPECT_EQ(MakeClient(server.address()).ListRuns({}).status().code(), absl::StatusCode::kUnauthenticated);
}

TEST(SecurityTest, BadTlsFilesAreRefusedAtStart) {
  const Certs& certs = Certs::Get();
  TempDir dir;
  FakeExecutor exec;
  auto start = [&](app::FrontOptions fronts, const security::Authenticator* auth) {
    app::ServerOptions o;
    o.data_dir = dir.path() + "/data";
    o.fronts = std::move(fronts);
    o.use_cuda = false;
    o.executor = &exec;
    o.auth = auth;
    return app::Server::Create(std::move(o));
  };
  auto open = security::Authenticator::Create("", "", nullptr);
  struct Case {
    security::TlsFiles files;
    std::string needle;
  };
  for (const Case& c : std::vector<Case>{
           {{certs.good + "/server.pem", certs.other + "/server.key", "", 10}, "does not match the certificate"},
           {{certs.good + "/server.key", certs.good + "/server.key", "", 10}, "holds no PEM certificate"},
           {{certs.good + "/server.pem", "", "", 10}, "both --tls-cert and --tls-key"},
       }) {
    app::FrontOptions opts;
    opts.listen = "127.0.0.1:0";
    opts.tls = c.files;
    auto server = start(opts, open->get());
    ASSERT_FALSE(server.ok());
    EXPECT_EQ(server.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(server.status().message().find(c.needle), std::string::npos) << server.status().message();
  }
  // Beyond loopback: tokens, and TLS unless --insecure-plaintext; for the
  // HTTP port as for the gRPC one.
  app::FrontOptions wide;
  wide.listen = "0.0.0.0:0";
  auto refused = start(wide, open->get());
  EXPECT_NE(refused.status().message().find("--listen 0.0.0.0:0 is not a loopback address"), std::string::npos)
      << refused.status();
  EXPECT_NE(refused.status().message().find("requires --auth-tokens-file"), std::string::npos) << refused.status();
  Principals principals(dir.path(), Principal("alice", "user"));
  refused = start(wide, principals.auth.get());
  EXPECT_NE(refused.status().message().find("requires TLS"), std::string::npos) << refused.status();
  app::FrontOptions wide_http;
  wide_http.listen = "127.0.0.1:0";
  wide_http.http.listen = "0.0.0.0:0";
  refused = start(wide_http, principals.auth.get());
  EXPECT_NE(refused.status().message().find("--http 0.0.0.0:0"), std::string::npos) << refused.status();
  EXPECT_NE(refused.status().message().find("requires TLS"), std::string::npos) << refused.status();
  EXPECT_FALSE(std::filesystem::exists(dir.path() + "/data")) << "refused before --data is opened";
}

// Roles, ownership, per-principal queue limits and the audit log, on one
// server whose single slot is held by alice's long run.
TEST(SecurityTest, RolesOwnershipQuotasAndTheAuditLog) {
  TempDir dir;
  FakeExecutor exec;
  exec.step_time = std::chrono::milliseconds(20);
  Quotas quotas;
  Principals principals(dir.path(),
                        Principal("alice", "user") + Principal("bob", "user", "max_queued=2") +
                            Principal("carol", "reader") + Principal("root", "admin"),
                        &quotas);
  const std::string audit_path = dir.path() + "/audit.jsonl";
  auto audit = security::AuditLog::Open(audit_path);
  ASSERT_TRUE(audit.ok()) << audit.status();
  scheduler::SchedulerOptions sched;
  sched.quotas = &quotas;
  sched.max_queued_per_client = 50;
  Server server(dir.path(), &exec, sched, {}, nullptr, principals.auth.get(), audit->get());
  auto alice = MakeClient(server.address(), Token("alice"));
  auto bob = MakeClient(server.address(), Token("bob"));
  auto carol = MakeClient(server.address(), Token("carol"));
  auto root = MakeClient(server.address(), Token("root"));

  EXPECT_EQ(MakeClient(server.address()).ListRuns({}).status().code(), absl::StatusCode::kUnauthenticated);
  auto run = alice.SubmitRun(TinySpec(100000));
  ASSERT_TRUE(run.ok()) << run.status();
  EXPECT_EQ(run->owner(), "alice");

  // Bob may not cancel or delete alice's run; it goes on.
  absl::Status denied = bob.CancelRun(run->run_id()).status();
  EXPECT_EQ(denied.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_NE(denied.message().find("belongs to 'alice'"), std::string::npos) << denied;
  EXPECT_EQ(bob.DeleteRun(run->run_id()).status().code(), absl::StatusCode::kPermissionDenied);
  auto still = alice.GetRun(run->run_id());
  ASSERT_TRUE(still.ok());
  EXPECT_NE(still->state(), v1::RUN_STATE_CANCELLED);

  // Carol reads and submits nothing.
  EXPECT_TRUE(carol.GetRun(run->run_id()).ok());
  EXPECT_TRUE(carol.ListRuns({}).ok());
  EXPECT_EQ(carol.SubmitRun(TinySpec()).status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(carol.CancelRun(run->run_id()).status().code(), absl::StatusCode::kPermissionDenied);

  // Bob's limit is 2 queued runs, whatever client label he sends.
  for (int i = 0; i < 3; ++i) {
    client::ClientOptions o;
    o.server = server.address();
    o.token = Token("bob");
    o.client_name = "spoofed-" + std::to_string(i);
    client::Client labelled(o);
    auto r = labelled.SubmitRun(TinySpec());
    if (i < 2) {
      EXPECT_TRUE(r.ok()) << r.status();
    } else {
      EXPECT_EQ(r.status().code(), absl::StatusCode::kResourceExhausted);
      EXPECT_NE(r.status().message().find("max_queued for bob=2"), std::string::npos) << r.status();
    }
  }
  v1::ListRunsRequest mine;
  mine.set_mine(true);
  EXPECT_EQ(bob.ListRuns(mine)->runs_size(), 2);
  EXPECT_EQ(alice.ListRuns(mine)->runs_size(), 1);
  EXPECT_EQ(root.ListRuns({})->runs_size(), 3);
  EXPECT_EQ(bob.WhoAmI()->max_queued_runs(), 2u);

  // An admin may cancel anyone's run.
  auto cancelled = root.CancelRun(run->run_id());
  ASSERT_TRUE(cancelled.ok()) << cancelled.status();

  // One line per state-changing call, none for reads.
  std::vector<nlohmann::json> lines;
  std::istringstream in(ReadFile(audit_path));
  for (std::string line; std::getline(in, line);) lines.push_back(nlohmann::json::parse(line));
  const std::vector<std::tuple<std::string, std::string, std::string>> want = {
      {"alice", "SubmitRun", "OK"},
      {"bob", "CancelRun", "PERMISSION_DENIED"},
      {"bob", "DeleteRun", "PERMISSION_DENIED"},
      {"carol", "SubmitRun", "PERMISSION_DENIED"},
      {"carol", "CancelRun", "PERMISSION_DENIED"},
      {"bob", "SubmitRun", "OK"},
      {"bob", "SubmitRun", "OK"},
      {"bob", "SubmitRun", "RESOURCE_EXHAUSTED"},
      {"root", "CancelRun", "OK"}};
  ASSERT_EQ(lines.size(), want.size()) << ReadFile(audit_path);
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_EQ(lines[i]["principal"], std::get<0>(want[i])) << i;
    EXPECT_EQ(lines[i]["method"], std::get<1>(want[i])) << i;
    EXPECT_EQ(lines[i]["outcome"], std::get<2>(want[i])) << i;
    EXPECT_FALSE(lines[i]["peer"].get<std::string>().empty());
  }
  EXPECT_EQ(lines[7]["client"], "spoofed-2") << "the label is recorded, the principal decided";
  EXPECT_EQ(lines[0]["target"], run->run_id()) << "a submission names the run it made";
  EXPECT_EQ(lines[1]["target"], run->run_id());
}

TEST(SecurityTest, PrivateRunsHideOtherUsersRuns) {
  TempDir dir;
  FakeExecutor exec;
  Principals principals(dir.path(), Principal("alice", "user") + Principal("bob", "user") +
                                        Principal("carol", "reader") + Principal("root", "admin"));
  app::FrontOptions opts;
  opts.private_runs = true;
  Server server(dir.path(), &exec, {}, opts, nullptr, principals.auth.get());
  auto alice = MakeClient(server.address(), Token("alice"));
  auto bob = MakeClient(server.address(), Token("bob"));
  auto run = alice.SubmitRun(TinySpec());
  ASSERT_TRUE(run.ok()) << run.status();
  absl::Status hidden = bob.GetRun(run->run_id()).status();
  EXPECT_EQ(hidden.code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(hidden.message(), "run " + run->run_id() + " not found") << "the same answer as for no such run";
  EXPECT_EQ(bob.ListRuns({})->runs_size(), 0);
  v1::GetMetricsRequest metrics;
  metrics.set_run_id(run->run_id());
  EXPECT_EQ(bob.GetMetrics(metrics).status().code(), absl::StatusCode::kNotFound);
  std::atomic<bool> stop{false};
  v1::WatchRunRequest watch;
  watch.set_run_id(run->run_id());
  EXPECT_EQ(bob.Watch(
                   watch, [](const v1::RunEvent&) {}, stop)
                .code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(bob.CancelRun(run->run_id()).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(alice.ListRuns({})->runs_size(), 1);
  EXPECT_TRUE(alice.GetRun(run->run_id()).ok());
  EXPECT_TRUE(MakeClient(server.address(), Token("carol")).GetRun(run->run_id()).ok()) << "readers read all";
  EXPECT_EQ(MakeClient(server.address(), Token("root")).ListRuns({})->runs_size(), 1);
  EXPECT_TRUE(bob.WhoAmI()->private_runs());
  // Issue 51 item 3: a run named below the top level (a swap's source) is
  // read like the top-level one: bob's intervention on his own run cannot
  // swap from alice's, and the refusal reads as a missing run's.
  auto own = bob.SubmitRun(TinySpec());
  ASSERT_TRUE(own.ok()) << own.status();
  auto swap_from = [&](const std::string& source) {
    v1::InterveneRequest req;
    req.set_run_id(own->run_id());
    v1::Intervention* op = req.add_interventions();
    op->set_op(v1::Intervention::OP_SWAP_COORDINATES);
    op->set_source_run_id(source);
    return bob.RunAnalysis<v1::InterveneResponse>(req).status();
  };
  const absl::Status refused = swap_from(run->run_id()), missing = swap_from("r999");
  EXPECT_EQ(refused.code(), absl::StatusCode::kNotFound) << refused;
  EXPECT_EQ(refused.message(), "run " + run->run_id() + " not found");
  EXPECT_EQ(missing.code(), absl::StatusCode::kNotFound) << missing;
  EXPECT_EQ(missing.message(), "run r999 not found");
}

// The unary methods of the research services (all but WorkerService).
std::vector<const google::protobuf::MethodDescriptor*> ResearchUnaryMethods() {
  std::vector<const google::protobuf::MethodDescriptor*> out;
  for (const char* name :
       {"circuitlab.v1.ExperimentService", "circuitlab.v1.AnalysisService", "circuitlab.v1.ReproductionService"}) {
    const google::protobuf::ServiceDescriptor* service =
        google::protobuf::DescriptorPool::generated_pool()->FindServiceByName(name);
    EXPECT_NE(service, nullptr) << name;
    for (int i = 0; service != nullptr && i < service->method_count(); ++i) {
      const google::protobuf::MethodDescriptor* m = service->method(i);
      if (!m->server_streaming() && !m->client_streaming()) out.push_back(m);
    }
  }
  return out;
}

// One unary call of `method` with these request bytes and bearer token (the
// request is not parsed here: what the server answers to bytes).
grpc::Status RawCall(grpc::GenericStub& stub, const std::string& token, const std::string& method,
                     const std::string& bytes) {
  grpc::Slice slice(bytes);
  grpc::ByteBuffer request(&slice, 1), response;
  grpc::ClientContext ctx;
  ctx.AddMetadata("authorization", "Bearer " + token);
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  std::promise<grpc::Status> done;
  stub.UnaryCall(&ctx, method, grpc::StubOptions(), &request, &response,
                 [&](grpc::Status st) { done.set_value(std::move(st)); });
  return done.get_future().get();
}

// A path from a request type to each string field naming a run or a sweep
// ("run_id", "source_run_id", "sweep_id", ...), through sub-messages (a
// repeated one or a map: its first element; well-known types skipped).
struct RefPath {
  std::vector<const google::protobuf::FieldDescriptor*> fields;
  bool sweep = false;
};
void RefPaths(const google::protobuf::Descriptor* d, std::vector<const google::protobuf::FieldDescriptor*>& path,
              std::vector<const google::protobuf::Descriptor*>& seen, std::vector<RefPath>& out) {
  using FD = google::protobuf::FieldDescriptor;
  if (path.size() > 6 || d->file()->package() == "google.protobuf" ||
      std::find(seen.begin(), seen.end(), d) != seen.end()) {
    return;
  }
  seen.push_back(d);
  for (int i = 0; i < d->field_count(); ++i) {
    const FD* f = d->field(i);
    path.push_back(f);
    if (f->cpp_type() == FD::CPPTYPE_MESSAGE) {
      RefPaths(f->message_type(), path, seen, out);  // a map: its entry's value
    } else if (f->cpp_type() == FD::CPPTYPE_STRING && !f->is_repeated()) {
      const std::string& n = f->name();
      const auto ends = [&](const char* tail) {
        const std::string t = tail;
        return n.size() >= t.size() && n.compare(n.size() - t.size(), t.size(), t) == 0;
      };
      if (n == "run_id" || ends("_run_id")) out.push_back({path, false});
      if (n == "sweep_id" || ends("_sweep_id")) out.push_back({path, true});
    }
    path.pop_back();
  }
  seen.pop_back();
}
void SetAlong(google::protobuf::Message* m, const RefPath& p, const std::string& value) {
  for (size_t i = 0; i < p.fields.size(); ++i) {
    const google::protobuf::FieldDescriptor* f = p.fields[i];
    const google::protobuf::Reflection* r = m->GetReflection();
    if (i + 1 == p.fields.size()) {
      r->SetString(m, f, value);
      return;
    }
    m = !f->is_repeated()          ? r->MutableMessage(m, f)
        : r->FieldSize(*m, f) > 0 ? r->MutableRepeatedMessage(m, f, 0)
                                  : r->AddMessage(m, f);
  }
}

// Issue 51 item 2, table-driven: under --private-runs every run or sweep a
// request names, at any depth of any RPC's request (a swap's source, an
// inline recipe's analyses, whatever a later request adds), is read-checked
// like the request's own; bob naming alice's gets the very answer a run that
// does not exist gets, for every such field of every method, writes too.
TEST(SecurityTest, EveryRunAndSweepARequestNamesIsPrivate) {
  TempDir dir;
  FakeExecutor exec;
  Principals principals(dir.path(), Principal("alice", "user") + Principal("bob", "user"));
  app::FrontOptions opts;
  opts.private_runs = true;
  opts.http.listen = "127.0.0.1:0";
  Server server(dir.path(), &exec, {}, opts, nullptr, principals.auth.get());
  auto alice = MakeClient(server.address(), Token("alice"));
  ASSERT_TRUE(alice.SubmitRun(TinySpec()).ok());                             // r1
  ASSERT_TRUE(alice.SubmitSweep(SeedSweep(TinySpec(), {1})).ok());           // s1
  grpc::GenericStub stub(grpc::CreateChannel(server.address(), grpc::InsecureChannelCredentials()));
  auto call = [&](const std::string& method, const google::protobuf::Message& req) {
    return RawCall(stub, Token("bob"), method, req.SerializeAsString());
  };
  int checked = 0;
  std::set<std::string> methods;
  for (const google::protobuf::MethodDescriptor* m : ResearchUnaryMethods()) {  // WatchRun: PrivateRunsHideOtherUsersRuns
    const std::string name = m->service()->full_name();
    std::vector<RefPath> paths;
    std::vector<const google::protobuf::FieldDescriptor*> path;
    std::vector<const google::protobuf::Descriptor*> seen;
    RefPaths(m->input_type(), path, seen, paths);
    for (const RefPath& p : paths) {
      std::string where;
      for (const auto* f : p.fields) where += (where.empty() ? "" : ".") + f->name();
      const std::string hidden = p.sweep ? "s1" : "r1", none = p.sweep ? "s999" : "r999";
      std::unique_ptr<google::protobuf::Message> req(
          google::protobuf::MessageFactory::generated_factory()->GetPrototype(m->input_type())->New());
      SetAlong(req.get(), p, hidden);
      const grpc::Status refused = call("/" + std::string(name) + "/" + m->name(), *req);
      SetAlong(req.get(), p, none);
      const grpc::Status missing = call("/" + std::string(name) + "/" + m->name(), *req);
      const std::string kind = p.sweep ? "sweep " : "run ";
      EXPECT_EQ(refused.error_code(), grpc::StatusCode::NOT_FOUND)
          << m->name() << " " << where << ": " << refused.error_message();
      EXPECT_EQ(refused.error_message(), kind + hidden + " not found") << m->name() << " " << where;
      EXPECT_EQ(missing.error_message(), kind + none + " not found") << m->name() << " " << where;
      methods.insert(m->name());
      ++checked;
    }
  }
  std::printf("%d references in %zu methods\n", checked, methods.size());
  EXPECT_GE(checked, 25);
  EXPECT_TRUE(methods.contains("StartReproduction")) << "a recipe's analyses name runs";
  EXPECT_TRUE(methods.contains("Intervene"));
  // Over HTTP: the POST names a source in its body, the GETs their run.
  httplib::Client h("127.0.0.1", server.http_port());
  const httplib::Headers bob = {{"Authorization", "Bearer " + Token("bob")}};
  auto own = MakeClient(server.address(), Token("bob")).SubmitRun(TinySpec());
  ASSERT_TRUE(own.ok());
  for (const std::string source : {"r1", "r999"}) {
    auto got = h.Post("/api/v1/runs/" + own->run_id() + "/interventions", bob,
                      R"({"interventions": [{"op": "OP_SWAP_COORDINATES", "source_run_id": ")" + source + R"("}]})",
                      "application/json");
    ASSERT_TRUE(got);
    EXPECT_EQ(got->status, 404) << got->body;
    EXPECT_NE(got->body.find("run " + source + " not found"), std::string::npos) << source << ": " << got->body;
  }
  for (const std::string route : {"", "/metrics", "/coordinates", "/interventions", "/attention/stored"}) {
    auto got = h.Get("/api/v1/runs/r1" + route, bob);
    ASSERT_TRUE(got) << route;
    EXPECT_EQ(got->status, 404) << route << ": " << got->body;
  }
  EXPECT_EQ(h.Get("/api/v1/sweeps/s1", bob)->status, 404);
  EXPECT_EQ(h.Get("/api/v1/sweeps/s1/summary", bob)->status, 404);
}

// Issue 51 item 11: a worker token reaches WorkerService only. Every other
// RPC of every service, over gRPC, and the HTTP routes answer
// PERMISSION_DENIED (403), before the request is even parsed.
TEST(SecurityTest, TheWorkerRoleReachesWorkerServiceOnly) {
  TempDir dir;
  FakeExecutor exec;
  Principals principals(dir.path(), Principal("node", "worker") + Principal("root", "admin"));
  app::FrontOptions http;
  http.http.listen = "127.0.0.1:0";
  Server server(dir.path(), &exec, {}, http, nullptr, principals.auth.get());
  grpc::GenericStub stub(grpc::CreateChannel(server.address(), grpc::InsecureChannelCredentials()));
  auto call = [&](const std::string& method) { return RawCall(stub, Token("node"), method, ""); };
  int checked = 0;
  for (const google::protobuf::MethodDescriptor* m : ResearchUnaryMethods()) {  // WatchRun: below
    const grpc::Status s = call("/" + m->service()->full_name() + "/" + m->name());
    EXPECT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED) << m->full_name() << ": " << s.error_message();
    EXPECT_NE(s.error_message().find("worker role: it reaches WorkerService only"), std::string::npos)
        << s.error_message();
    ++checked;
  }
  EXPECT_GE(checked, 30);
  auto node = MakeClient(server.address(), Token("node"));
  std::atomic<bool> stop{false};
  v1::WatchRunRequest watch;
  watch.set_run_id("r1");
  EXPECT_EQ(node.Watch(watch, [](const v1::RunEvent&) {}, stop).code(), absl::StatusCode::kPermissionDenied);
  EXPECT_TRUE(node.ListWorkers().ok()) << "WorkerService itself answers";
  EXPECT_TRUE(MakeClient(server.address(), Token("root")).ListRuns({}).ok());
  httplib::Client h("127.0.0.1", server.http_port());
  for (const char* path : {"/api/v1/runs", "/api/v1/recipes", "/api/v1/reproductions", "/api/v1/whoami", "/api/v1/analyses"}) {
    auto got = h.Get(path, {{"Authorization", "Bearer " + Token("node")}});
    ASSERT_TRUE(got) << path;
    EXPECT_EQ(got->status, 403) << path << ": " << got->body;
  }
}

TEST(SecurityTest, ARevokedTokenFailsAfterReloadWithoutARestart) {
  TempDir dir;
  FakeExecutor exec;
  Principals principals(dir.path(), Principal("alice", "user") + Principal("bob", "user"));
  Server server(dir.path(), &exec, {}, {}, nullptr, principals.auth.get());
  auto bob = MakeClient(server.address(), Token("bob"));
  ASSERT_TRUE(bob.ListRuns({}).ok());
  std::ofstream(principals.path) << Principal("alice", "user");
  ASSERT_TRUE(principals.auth->Reload().ok());
  EXPECT_EQ(bob.ListRuns({}).status().code(), absl::StatusCode::kUnauthenticated);
  EXPECT_TRUE(MakeClient(server.address(), Token("alice")).ListRuns({}).ok());
}

// Issue 32 item 2: a sweep summary's label columns start LabelRun jobs only
// for those who may start analyses (a reader sees "not labelled yet", as its
// LabelRun would be refused), and a summary that started jobs is audited.
TEST(SecurityTest, AReaderSummaryStartsNoAnalysisAndAUsersIsAudited) {
  TempDir dir;
  FakeExecutor exec;
  Principals principals(dir.path(), Principal("alice", "user") + Principal("carol", "reader"));
  const std::string audit_path = dir.path() + "/audit.jsonl";
  auto audit = security::AuditLog::Open(audit_path);
  ASSERT_TRUE(audit.ok()) << audit.status();
  app::FrontOptions http;
  http.http.listen = "127.0.0.1:0";
  Server server(dir.path(), &exec, {}, http, nullptr, principals.auth.get(), audit->get());
  auto alice = MakeClient(server.address(), Token("alice"));
  auto carol = MakeClient(server.address(), Token("carol"));
  auto sweep = alice.SubmitSweep(LrBySeedSweep("labels", 40, 1.0, 2.0));
  ASSERT_TRUE(sweep.ok()) << sweep.status();
  for (const std::string& id : sweep->run_ids()) ASSERT_EQ(WaitForEnd(alice, id), v1::RUN_STATE_SUCCEEDED);
  v1::GetSweepSummaryRequest req;
  req.set_sweep_id(sweep->sweep_id());
  req.add_values("circuit");
  req.add_values("pair");
  auto by_reader = carol.GetSweepSummary(req);
  ASSERT_TRUE(by_reader.ok()) << by_reader.status();
  for (const v1::SweepRow& r : by_reader->rows()) {
    EXPECT_EQ(r.values(0).string_value(), "not labelled yet (a reader cannot start labels)") << r.DebugString();
  }
  httplib::Client h("127.0.0.1", server.http_port());
  auto over_http = h.Get("/api/v1/sweeps/" + sweep->sweep_id() + "/summary?values=circuit,pair",
                         {{"Authorization", "Bearer " + Token("carol")}});
  ASSERT_EQ(over_http->status, 200) << over_http->body;
  EXPECT_NE(over_http->body.find("not labelled yet"), std::string::npos) << over_http->body;
  EXPECT_EQ(alice.ListAnalysisJobs()->jobs_size(), 0) << "the reader started nothing";
  EXPECT_EQ(ReadFile(audit_path).find("GetSweepSummary"), std::string::npos);
  // The owner's summary starts the jobs (they fail here: the fake executor's
  // checkpoints are not LibTorch's) and leaves one audit line.
  auto by_user = alice.GetSweepSummary(req);
  ASSERT_TRUE(by_user.ok()) << by_user.status();
  EXPECT_GT(by_user->pending(), 0u);
  int audited = 0;
  std::istringstream in(ReadFile(audit_path));
  for (std::string line; std::getline(in, line);) {
    const nlohmann::json j = nlohmann::json::parse(line);
    if (j["method"] == "GetSweepSummary") {
      EXPECT_EQ(j["principal"], "alice");
      EXPECT_EQ(j["target"], sweep->sweep_id());
      ++audited;
    }
  }
  EXPECT_EQ(audited, 1) << ReadFile(audit_path);
}

// Issue 32 item 6: revoking a token (SIGHUP re-reads the file) also ends
// that principal's open streams: WatchRun ends UNAUTHENTICATED and the HTTP
// event stream closes, within a second; another principal's stream goes on.
TEST(SecurityTest, RevokingATokenEndsItsOpenStreams) {
  TempDir dir;
  FakeExecutor exec;
  exec.Close();  // the run stays RUNNING, so its streams stay open
  Principals principals(dir.path(), Principal("alice", "user") + Principal("bob", "user"));
  app::FrontOptions http;
  http.http.listen = "127.0.0.1:0";
  Server server(dir.path(), &exec, {}, http, nullptr, principals.auth.get());
  auto alice = MakeClient(server.address(), Token("alice"));
  v1::ExperimentSpec spec = TinySpec();
  auto run = alice.SubmitRun(spec);
  ASSERT_TRUE(run.ok()) << run.status();
  v1::WatchRunRequest w;
  w.set_run_id(run->run_id());
  auto watch = [&](const std::string& who, std::atomic<bool>& stop) {
    return std::async(std::launch::async, [&, who] {
      return MakeClient(server.address(), Token(who)).Watch(w, [](const v1::RunEvent&) {}, stop,
                                                            std::chrono::milliseconds(0));
    });
  };
  std::atomic<bool> stop_bob{false}, stop_alice{false};
  auto bob_watch = watch("bob", stop_bob);
  auto alice_watch = watch("alice", stop_alice);
  // Bob's event stream over HTTP, read on a thread until it closes.
  std::atomic<bool> sse_open{false}, sse_closed{false};
  std::thread sse([&] {
    httplib::Client c("127.0.0.1", server.http_port());
    c.set_read_timeout(std::chrono::seconds(30));
    c.Get("/api/v1/runs/" + run->run_id() + "/events", {{"Authorization", "Bearer " + Token("bob")}},
          [&](const char*, size_t) {
            sse_open = true;
            return true;
          });
    sse_closed = true;
  });
  ASSERT_TRUE(WaitFor([&] { return sse_open.load(); }));
  // Both watches and the event stream are registered (not a fixed sleep: a
  // loaded CI machine took longer than 300 ms to open them).
  ASSERT_TRUE(WaitFor([&] { return server.app().OpenStreamCount() == 3; }, std::chrono::seconds(20)))
      << server.app().OpenStreamCount() << " streams open";
  ASSERT_EQ(bob_watch.wait_for(std::chrono::seconds(0)), std::future_status::timeout);

  std::ofstream(principals.path) << Principal("alice", "user");
  ASSERT_TRUE(principals.auth->Reload().ok());
  EXPECT_EQ(server.app().RevalidateStreams(), 2) << "bob's WatchRun and his event stream";
  ASSERT_EQ(bob_watch.wait_for(std::chrono::seconds(2)), std::future_status::ready);
  const absl::Status ended = bob_watch.get();
  EXPECT_EQ(ended.code(), absl::StatusCode::kUnauthenticated) << ended;
  EXPECT_NE(ended.message().find("revoked"), absl::string_view::npos) << ended;
  EXPECT_TRUE(WaitFor([&] { return sse_closed.load(); }, std::chrono::seconds(2)));
  EXPECT_EQ(alice_watch.wait_for(std::chrono::milliseconds(200)), std::future_status::timeout) << "alice's goes on";
  stop_alice = true;
  exec.Open();
  const absl::Status alice_end = alice_watch.get();  // stopped by us, or ended with the run
  EXPECT_TRUE(alice_end.ok() || absl::IsCancelled(alice_end)) << alice_end;
  sse.join();
}

TEST(SecurityTest, ReflectionNeedsATokenWhenTokensAreConfigured) {
  TempDir dir;
  FakeExecutor exec;
  Principals principals(dir.path(), Principal("carol", "reader"));
  Server server(dir.path(), &exec, {}, {}, nullptr, principals.auth.get());
  EXPECT_EQ(ListServicesByReflection(server.address()).status().code(), absl::StatusCode::kUnauthenticated);
  EXPECT_EQ(ListServicesByReflection(server.address(), "tok-wrong-0123456789").status().code(),
            absl::StatusCode::kUnauthenticated);
  absl::StatusOr<std::string> listed = ListServicesByReflection(server.address(), Token("carol"));
  ASSERT_TRUE(listed.ok()) << listed.status();
  EXPECT_NE(listed->find("circuitlab.v1.ExperimentService"), std::string::npos);
  EXPECT_TRUE(MakeClient(server.address()).Health().ok()) << "health stays open for probes";
}

}  // namespace
}  // namespace circuitlab::testing
