// Parsers of torchrun's rendezvous flags: accepted spellings and the messages for bad ones.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <utility>
#include <vector>

#include "ddp/rendezvous/options.hpp"
#include "ddp/util/error.hpp"

namespace ddp::rdzv {
namespace {

std::string usage_message(const std::function<void()>& f) {
  try {
    f();
  } catch (const UsageError& e) {
    return e.what();
  }
  return "(no UsageError)";
}

TEST(RdzvOptions, NnodesFixedAndRange) {
  auto a = parse_nnodes("3");
  EXPECT_EQ(a.min, 3);
  EXPECT_EQ(a.max, 3);
  auto b = parse_nnodes("2:4");
  EXPECT_EQ(b.min, 2);
  EXPECT_EQ(b.max, 4);
  for (const char* bad : {"0", "4:2", "x", "1:", ":3", "-1", "2:3:4"}) {
    EXPECT_NE(usage_message([&] { parse_nnodes(bad); }).find("expected N or MIN:MAX"),
              std::string::npos)
        << bad;
  }
}

TEST(RdzvOptions, EndpointDefaultsPortAndParsesIpv6) {
  auto e = parse_endpoint("node1", kDefaultRendezvousPort);
  EXPECT_EQ(e.host, "node1");
  EXPECT_EQ(e.port, 29400);
  e = parse_endpoint("10.0.0.1:1234", kDefaultRendezvousPort);
  EXPECT_EQ(e.host, "10.0.0.1");
  EXPECT_EQ(e.port, 1234);
  e = parse_endpoint("[::1]:99", kDefaultRendezvousPort);
  EXPECT_EQ(e.host, "::1");
  EXPECT_EQ(e.port, 99);
  EXPECT_NE(usage_message([] { parse_endpoint("h:99999", 1); }).find("not a number in 0..65535"),
            std::string::npos);
  EXPECT_NE(usage_message([] { parse_endpoint("::1", 1); }).find("brackets"), std::string::npos);
  EXPECT_NE(usage_message([] { parse_endpoint(":80", 1); }).find("no host"), std::string::npos);
}

TEST(RdzvOptions, ConfKeys) {
  auto c = parse_rdzv_conf("join_timeout=12,last_call_timeout=0.5,close_timeout=3,heartbeat=2");
  EXPECT_EQ(c.join_timeout.count(), 12000);
  EXPECT_EQ(c.last_call_timeout.count(), 500);
  EXPECT_EQ(c.close_timeout.count(), 3000);
  EXPECT_EQ(c.heartbeat.count(), 2000);
  EXPECT_FALSE(c.token_file);
  EXPECT_EQ(parse_rdzv_conf("token_file=/x/y").token_file.value(), "/x/y");
  EXPECT_EQ(parse_rdzv_conf("").join_timeout, RendezvousConf::kDefaultJoinTimeout);
  std::string m = usage_message([] { parse_rdzv_conf("join_timeot=3"); });
  EXPECT_NE(m.find("unknown key 'join_timeot'"), std::string::npos) << m;
  EXPECT_NE(m.find("join_timeout"), std::string::npos) << m;
  EXPECT_NE(usage_message([] { parse_rdzv_conf("heartbeat=-1"); }).find("positive number"),
            std::string::npos);
  EXPECT_NE(usage_message([] { parse_rdzv_conf("heartbeat"); }).find("key=value"),
            std::string::npos);
}

TEST(RdzvOptions, BackendAndRunId) {
  EXPECT_EQ(parse_backend("c10d"), Backend::kC10d);
  EXPECT_EQ(parse_backend("static"), Backend::kStatic);
  EXPECT_EQ(parse_backend("etcd"), Backend::kEtcd);
  EXPECT_EQ(parse_backend("etcd-v2"), Backend::kEtcdV2);
  EXPECT_STREQ(to_string(Backend::kEtcdV2), "etcd-v2");
  EXPECT_NE(usage_message([] { parse_backend("zookeeper"); }).find("unknown backend"),
            std::string::npos);
  EXPECT_NO_THROW(validate_run_id("job-1234_5.a:b"));
  EXPECT_NE(usage_message([] { validate_run_id("a/b"); }).find("'/' is not allowed"),
            std::string::npos);
  EXPECT_NE(usage_message([] { validate_run_id(""); }).find("empty"), std::string::npos);
}

TEST(RdzvOptions, StaticNeedsFixedCountAndRankInRange) {
  RendezvousOptions o;
  o.backend = Backend::kStatic;
  o.nodes = {2, 3};
  o.node_rank = 0;
  EXPECT_NE(usage_message([&] { validate(o); }).find("needs a fixed node count"),
            std::string::npos);
  o.nodes = {2, 2};
  o.node_rank = 2;
  EXPECT_NE(usage_message([&] { validate(o); }).find("distinct rank in 0..1"), std::string::npos);
}

TEST(RdzvOptions, EtcdEndpointListAndConfKeys) {
  auto e = parse_endpoints("a:1,b,[::1]:3", kDefaultEtcdPort);
  ASSERT_EQ(e.size(), 3u);
  EXPECT_EQ(e[1].host, "b");
  EXPECT_EQ(e[1].port, 2379);
  EXPECT_EQ(e[2].host, "::1");
  EXPECT_NE(usage_message([] { parse_endpoints("a,,b", 1); }).find("empty entry"),
            std::string::npos);
  RendezvousConf c = parse_rdzv_conf(
      "protocol=https,cacert=/ca.pem,cert=/c.pem,key=/c.key,read_timeout=7,etcd_prefix=/x/,"
      "key_ttl=9,timeout=12");
  EXPECT_TRUE(c.https);
  EXPECT_EQ(c.cacert, "/ca.pem");
  EXPECT_EQ(c.key, "/c.key");
  EXPECT_EQ(c.read_timeout, Millis(7000));
  EXPECT_EQ(c.etcd_prefix, "/x/");
  EXPECT_EQ(c.key_ttl, Millis(9000));
  EXPECT_EQ(c.timeout, Millis(12000));
  EXPECT_FALSE(c.join_timeout_given);
  EXPECT_NE(usage_message([] { parse_rdzv_conf("protocol=ftp"); }).find("expected http or https"),
            std::string::npos);
  EXPECT_NE(usage_message([] { parse_rdzv_conf("cert="); }).find("expected a file path"),
            std::string::npos);
}

TEST(RdzvOptions, EtcdKeysBelongToTheEtcdBackends) {
  RendezvousOptions o;
  o.backend = Backend::kC10d;
  o.conf = parse_rdzv_conf("cacert=/ca.pem");
  EXPECT_NE(usage_message([&] { validate(o); }).find("only the etcd backends take this key"),
            std::string::npos);
  o.backend = Backend::kEtcd;
  EXPECT_NE(usage_message([&] { validate(o); }).find("TLS files need protocol=https"),
            std::string::npos);
  o.conf = parse_rdzv_conf("protocol=https,key=/k.pem");
  EXPECT_NE(usage_message([&] { validate(o); }).find("without cert=FILE"), std::string::npos);
  o.conf = parse_rdzv_conf("protocol=https,cacert=/ca.pem,cert=/c.pem,key=/k.pem");
  EXPECT_NO_THROW(validate(o));
  o.endpoints = {{"a", 1}, {"b", 2}};
  EXPECT_NO_THROW(validate(o));
  o.backend = Backend::kC10d;
  o.conf = RendezvousConf();
  EXPECT_NE(usage_message([&] { validate(o); }).find("only the etcd backends take a list"),
            std::string::npos);
}

TEST(RdzvOptions, StandbyStoresAreACountForC10dOnly) {
  EXPECT_EQ(parse_rdzv_conf("").standby_stores, RendezvousConf::kDefaultStandbyStores);
  EXPECT_EQ(parse_rdzv_conf("standby_stores=0").standby_stores, 0);
  EXPECT_EQ(parse_rdzv_conf("standby_stores=3").standby_stores, 3);
  for (const char* bad : {"standby_stores=-1", "standby_stores=two", "standby_stores=17"}) {
    EXPECT_NE(usage_message([&] { parse_rdzv_conf(bad); }).find("expected a count from 0"),
              std::string::npos)
        << bad;
  }
  RendezvousOptions o;
  o.conf = parse_rdzv_conf("standby_stores=1");
  EXPECT_NO_THROW(validate(o));
  o.backend = Backend::kEtcd;  // the --recovery step store's standbys
  EXPECT_NO_THROW(validate(o));
  o.backend = Backend::kStatic;
  o.nodes = {2, 2};
  o.node_rank = 0;
  EXPECT_NE(usage_message([&] { validate(o); }).find("only the c10d and etcd backends keep"),
            std::string::npos);
}

TEST(RdzvOptions, TokenFile) {
  std::string path = ::testing::TempDir() + "/rdzv_token";
  { std::ofstream(path) << "s3cret\n"; }
  ::chmod(path.c_str(), 0600);
  EXPECT_EQ(read_token_file(path), "s3cret");
  EXPECT_NE(usage_message([] { read_token_file("/nonexistent/token"); }).find("cannot read"),
            std::string::npos);
  std::remove(path.c_str());
}

// Issue 49, finding 9: the token is the job's secret. A file other users can read or change,
// one another user owns, or something that is not a regular file is refused with the fix; a
// link to a private file is followed (Kubernetes mounts secrets through links).
TEST(RdzvOptions, TokenFileOthersCouldReadOrChangeIsRefused) {
  const std::string dir = ::testing::TempDir() + "/rdzv_token_modes";
  ::mkdir(dir.c_str(), 0700);
  const std::string path = dir + "/token";
  { std::ofstream(path) << "s3cret\n"; }
  for (const auto& [mode, verb] : std::vector<std::pair<mode_t, std::string>>{
           {0644, "read"}, {0604, "read"}, {0602, "change"}, {0620, "change"}}) {
    ::chmod(path.c_str(), mode);
    const std::string message = usage_message([&] { read_token_file(path); });
    EXPECT_NE(message.find(fmt::format("has mode {:04o}, so other users can {} the job's secret; "
                                       "run chmod 600 {}",
                                       mode, verb, path)),
              std::string::npos)
        << message;
  }
  ::chmod(path.c_str(), 0640);  // the group may read it (a shared group's job)
  EXPECT_EQ(read_token_file(path), "s3cret");

  const std::string link = dir + "/link";
  ::symlink(path.c_str(), link.c_str());
  EXPECT_EQ(read_token_file(link), "s3cret");

  if (::geteuid() == 0) {  // only root can give a file away
    ASSERT_EQ(::chown(path.c_str(), 65534, 65534), 0);
    const std::string message = usage_message([&] { read_token_file(path); });
    EXPECT_NE(message.find("belongs to uid 65534, not to this user (uid 0) or root"),
              std::string::npos)
        << message;
  }

  const std::string fifo = dir + "/fifo";
  ::mkfifo(fifo.c_str(), 0600);
  EXPECT_NE(usage_message([&] { read_token_file(fifo); }).find("not a regular file"),
            std::string::npos);
  for (const auto& f : {fifo, link, path}) std::remove(f.c_str());
  ::rmdir(dir.c_str());
}

}  // namespace
}  // namespace ddp::rdzv
