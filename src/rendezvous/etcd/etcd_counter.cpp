#include "etcd_counter.hpp"

#include <fmt/format.h>

namespace ddp::rdzv::etcd {

namespace {

// Starts every counter form. A value between kMarker and kPastMarker (bytewise) starts with
// kMarker: etcd's compares pick counter forms out by that.
const std::string kMarker(
    "\x01"
    "ddp-counter:",
    13);
const std::string kPastMarker(
    "\x01"
    "ddp-counter;",
    13);

}  // namespace

std::string counter_form(int64_t base, int64_t base_version) {
  return fmt::format("{}{}:{}", kMarker, base, base_version);
}

std::optional<int64_t> counter_of(const KeyValue& kv) {
  if (kv.value.rfind(kMarker, 0) != 0) return parse_int64(kv.value);
  const std::string rest = kv.value.substr(kMarker.size());
  const size_t colon = rest.find(':');
  if (colon == std::string::npos) return std::nullopt;
  auto base = parse_int64(rest.substr(0, colon));
  auto base_version = parse_int64(rest.substr(colon + 1));
  if (!base || !base_version) return std::nullopt;
  return *base + (kv.version - *base_version);
}

std::string visible_value(const KeyValue& kv) {
  if (kv.value.rfind(kMarker, 0) != 0) return kv.value;
  auto n = counter_of(kv);
  return n ? std::to_string(*n) : kv.value;
}

std::string counter_ticket(const std::string& key, const std::string& client, uint64_t seq) {
  return key + std::string("\0tickets/", 9) + client + "/" + std::to_string(seq);
}

Json increment_txn(const std::string& key, const std::string& ticket, int64_t lease) {
  Json create = txn(Json::array({compare_absent(key)}),
                    Json::array({{{"request_put", put_op(key, counter_form(1, 1), lease)}},
                                 {{"request_put", put_op(ticket, "", lease)}}}),
                    Json::array({{{"request_range", range_op(key)}}}));
  Json raise = txn(
      Json::array({compare_value_greater(key, kMarker), compare_value_less(key, kPastMarker)}),
      Json::array({{{"request_put", touch_op(key)}}, {{"request_put", put_op(ticket, "", lease)}}}),
      Json::array({{{"request_txn", std::move(create)}}}));
  return txn(Json::array({compare_absent(ticket)}),
             Json::array({{{"request_txn", std::move(raise)}}}),
             Json::array({{{"request_range", range_op(ticket)}}}));
}

Json compare_and_add_txn(const std::string& key, const std::string& ticket,
                         const std::optional<KeyValue>& current, int64_t value, int64_t delta,
                         int64_t lease) {
  // After this put the key's version is one more than now (1 when it is created).
  const int64_t next_version = current ? current->version + 1 : 1;
  Json unchanged = current ? compare_mod_revision(key, current->mod_revision) : compare_absent(key);
  return txn(
      Json::array({compare_absent(ticket), std::move(unchanged)}),
      Json::array({{{"request_put", put_op(key, counter_form(value + delta, next_version), lease)}},
                   {{"request_put", put_op(ticket, "", lease)}}}),
      Json::array({{{"request_range", range_op(ticket)}}, {{"request_range", range_op(key)}}}));
}

}  // namespace ddp::rdzv::etcd
