// SLURM host-list expansion: the syntax SLURM's own hostlist accepts, the errors for what it
// rejects, and (when scontrol is installed) agreement with `scontrol show hostnames`.
#include "ddp/cluster/hostlist.hpp"

#include <gtest/gtest.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include <fstream>
#include <random>
#include <sstream>

#include "ddp/util/error.hpp"

namespace ddp::cluster {
namespace {

using Hosts = std::vector<std::string>;

TEST(Hostlist, SingleHostAndPlainList) {
  EXPECT_EQ(expand_hostlist("node1"), Hosts{"node1"});
  EXPECT_EQ(expand_hostlist("a,b,c"), (Hosts{"a", "b", "c"}));
  EXPECT_EQ(expand_hostlist("n-1.example.org"), Hosts{"n-1.example.org"});
}

TEST(Hostlist, RangesAndCommasInsideBrackets) {
  EXPECT_EQ(expand_hostlist("gpu[001-004,007]"),
            (Hosts{"gpu001", "gpu002", "gpu003", "gpu004", "gpu007"}));
}

TEST(Hostlist, SeveralGroups) {
  EXPECT_EQ(expand_hostlist("a[1-2],b3,c[05-06]"), (Hosts{"a1", "a2", "b3", "c05", "c06"}));
}

TEST(Hostlist, ZeroPaddingFollowsTheLowerBound) {
  EXPECT_EQ(expand_hostlist("n[08-11]"), (Hosts{"n08", "n09", "n10", "n11"}));
  EXPECT_EQ(expand_hostlist("n[9-11]"), (Hosts{"n9", "n10", "n11"}));
  EXPECT_EQ(expand_hostlist("n[001-3]"), (Hosts{"n001", "n002", "n003"}));
}

TEST(Hostlist, SeveralBracketGroupsInOneNameExpandLeftmostOutermost) {
  EXPECT_EQ(expand_hostlist("rack[1-2]-node[01-02]"),
            (Hosts{"rack1-node01", "rack1-node02", "rack2-node01", "rack2-node02"}));
}

TEST(Hostlist, BareBracketAndWhitespaceSeparators) {
  EXPECT_EQ(expand_hostlist("[1-3]"), (Hosts{"1", "2", "3"}));
  EXPECT_EQ(expand_hostlist(" a b\tc "), (Hosts{"a", "b", "c"}));
}

TEST(Hostlist, EmptyEntriesAreSkippedLikeSlurm) {
  EXPECT_EQ(expand_hostlist("a,,b,"), (Hosts{"a", "b"}));
}

TEST(Hostlist, DuplicatesAreKept) {
  EXPECT_EQ(expand_hostlist("a,a"), (Hosts{"a", "a"}));
}

// The message must name the list, the position and a fix.
void expect_error(const std::string& list, const std::string& what, const std::string& where) {
  try {
    expand_hostlist(list);
    FAIL() << "no error for \"" << list << "\"";
  } catch (const UsageError& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find("\"" + list + "\""), std::string::npos) << msg;
    EXPECT_NE(msg.find(what), std::string::npos) << msg;
    EXPECT_NE(msg.find(where), std::string::npos) << msg;
  }
}

TEST(HostlistErrors, EmptyList) {
  expect_error("", "is empty", "e.g.");
  expect_error(" , ", "is empty", "e.g.");
}

TEST(HostlistErrors, UnbalancedBrackets) {
  expect_error("gpu[1-4", "unclosed '['", "position 4");
  expect_error("gpu1-4]", "']' without a matching '['", "position 7");
  expect_error("a[1-[2]]", "nested '['", "position 5");
}

TEST(HostlistErrors, ReversedRangeNamesTheFix) {
  expect_error("gpu[4-1]", "reversed range 4-1", "write the lower number first: \"1-4\"");
}

TEST(HostlistErrors, StepIsNotSlurmSyntax) {
  expect_error("n[1-9:2]", "range with a step", "no steps");
}

TEST(HostlistErrors, EmptyBracketsAndEntries) {
  expect_error("n[]", "empty brackets", "position 2");
  expect_error("n[1,,2]", "empty entry inside brackets", "position 5");
}

TEST(HostlistErrors, NonNumbersAndNegativeNumbers) {
  expect_error("n[a-b]", "is not a number", "position 3");
  expect_error("n[-1]", "is not a number", "position 3");
  expect_error("n[1--2]", "is not a number", "position 3");
}

TEST(HostlistErrors, TextAfterTheLastGroup) {
  expect_error("n[1-2]x", "text \"x\" after ']'", "position 7");
}

TEST(HostlistErrors, HugeExpansionsAreRefused) {
  expect_error("n[0-999999999]", "too many hosts", "at most");
  expect_error("a[0-1023]b[0-1023]c[0-1]", "too many hosts", "at most");
  expect_error("n[1234567890123456789]", "too long", "digits");
}

TEST(HostlistCompress, RoundTripsAndIsCompact) {
  Hosts hosts{"gpu001", "gpu002", "gpu003", "gpu004", "gpu007"};
  EXPECT_EQ(compress_hostlist(hosts), "gpu[001-004,007]");
  EXPECT_EQ(compress_hostlist({"a1", "a2", "b3", "c05", "c06"}), "a[1-2],b3,c[05-06]");
  EXPECT_EQ(compress_hostlist({"n9", "n10", "n11"}), "n[9-11]");
  EXPECT_EQ(compress_hostlist({"login", "n1"}), "login,n1");
  for (const Hosts& h : {hosts, Hosts{"n09", "n10", "n8"}, Hosts{"x", "x1", "x01", "x2"},
                         Hosts{"r1n1", "r1n2", "r2n1"}, Hosts{"a", "a"}}) {
    EXPECT_EQ(expand_hostlist(compress_hostlist(h)), h) << compress_hostlist(h);
  }
}

// Deterministic random inputs: compress/expand round-trips any host vector, and arbitrary
// strings over the list alphabet either expand or throw UsageError (never crash or hang).
TEST(HostlistRandom, RoundTripAndGarbage) {
  std::mt19937 rng(20240607);
  auto pick = [&](int n) { return static_cast<int>(rng() % static_cast<unsigned>(n)); };
  const std::vector<std::string> prefixes{"n", "gpu", "rack1-node", "a.b", "x9y"};
  for (int round = 0; round < 500; ++round) {
    Hosts hosts;
    int count = 1 + pick(12);
    for (int i = 0; i < count; ++i) {
      std::string number = std::to_string(pick(120));
      if (pick(3) == 0) number.insert(0, static_cast<size_t>(pick(3)), '0');
      hosts.push_back(prefixes[pick(static_cast<int>(prefixes.size()))] +
                      (pick(8) == 0 ? "" : number));
    }
    std::string compact = compress_hostlist(hosts);
    EXPECT_EQ(expand_hostlist(compact), hosts) << compact;
  }
  const std::string alphabet = "ab01-9[],: \t";
  for (int round = 0; round < 5000; ++round) {
    std::string list;
    int len = pick(16);
    for (int i = 0; i < len; ++i) list += alphabet[pick(static_cast<int>(alphabet.size()))];
    try {
      Hosts hosts = expand_hostlist(list);
      EXPECT_FALSE(hosts.empty()) << list;
    } catch (const UsageError&) {
    }
  }
}

// Runs `scontrol show hostnames LIST` with a throw-away slurm.conf (scontrol needs one even
// for this offline command). Returns false when scontrol rejects the list: it prints
// "Invalid hostlist" on stderr and still exits 0, so stderr is read too.
bool scontrol_expand(const std::string& conf, const std::string& list, Hosts& out) {
  std::string cmd = "SLURM_CONF='" + conf + "' scontrol show hostnames '" + list + "' 2>&1";
  FILE* pipe = popen(cmd.c_str(), "r");
  if (pipe == nullptr) return false;
  char buf[4096];
  std::string text;
  while (fgets(buf, sizeof(buf), pipe) != nullptr) text += buf;
  int status = pclose(pipe);
  std::istringstream lines(text);
  out.clear();
  for (std::string line; std::getline(lines, line);) {
    if (!line.empty() && line.rfind("scontrol:", 0) != 0) out.push_back(line);
  }
  return status == 0 && text.find("Invalid hostlist") == std::string::npos;
}

TEST(HostlistVsScontrol, SameExpansionAndSameRejections) {
  if (system("command -v scontrol >/dev/null 2>&1") != 0) {
    GTEST_SKIP() << "scontrol is not installed (Debian package slurm-client); nothing to "
                    "compare against";
  }
  char dir[] = "/tmp/ddp-hostlist-XXXXXX";
  ASSERT_NE(mkdtemp(dir), nullptr);
  std::string conf = std::string(dir) + "/slurm.conf";
  std::ofstream(conf) << "ClusterName=ddptest\nSlurmctldHost=localhost\n";

  for (const std::string list :
       {"gpu[001-004,007]", "a[1-2],b3,c[05-06]", "rack[1-2]-node[01-02]", "n[08-11]", "n[9-11]",
        "n[001-3]", "[1-3]", "a,,b", "x[1,3,5-6],y"}) {
    Hosts theirs;
    ASSERT_TRUE(scontrol_expand(conf, list, theirs)) << "scontrol rejected " << list;
    EXPECT_EQ(expand_hostlist(list), theirs) << list;
  }
  for (const std::string list : {"gpu[4-1]", "n[1-9:2]", "n[]", "n[1-2]x", "n[a-b]"}) {
    Hosts theirs;
    EXPECT_FALSE(scontrol_expand(conf, list, theirs)) << "scontrol accepted " << list;
    EXPECT_THROW(expand_hostlist(list), UsageError) << list;
  }
  unlink(conf.c_str());
  rmdir(dir);
}

}  // namespace
}  // namespace ddp::cluster
