#pragma once
// How EtcdStore::add() keeps a counter in one etcd key, so that an increment of 1 is one
// request that costs etcd O(1) work and never retries, however many clients add at once (the
// rendezvous's join counter: 10,000 agents each add 1).
//
// The key's value is "<marker><base>:<base_version>" and the counter is
//     base + (the key's version - base_version)
// etcd raises a key's version by one at every put, so an increment of 1 is a put that keeps
// the value (touch_op) and reads the previous key-value: no compare on the counter, so
// concurrent increments serialise in etcd's apply loop instead of retrying each other. Any
// other delta (and an add to a key that set() wrote a plain integer to) is a compare-and-set on
// the key's mod revision that writes a new base at the version it will have.
//
// Every increment also creates a ticket key of its own (unique per client and call) in the same
// transaction, so a request sent again after a lost reply is recognised (its ticket exists) and
// answers with the counter as that first transaction left it (a read at the ticket's revision)
// instead of counting twice. Internal to src/rendezvous/etcd.

#include <cstdint>
#include <optional>
#include <string>

#include "etcd_json.hpp"

namespace ddp::rdzv::etcd {

// A counter's stored value: `base` at the key's version `base_version`.
std::string counter_form(int64_t base, int64_t base_version);

// The counter a key holds: its counter form decoded, or a plain integer (set() wrote it).
// nullopt for any other value.
std::optional<int64_t> counter_of(const KeyValue& kv);

// What get() returns for a key: a counter as its decimal value, any other value as stored.
std::string visible_value(const KeyValue& kv);

// The ticket key of one increment (`client` and `seq` make it unique).
std::string counter_ticket(const std::string& key, const std::string& client, uint64_t seq);

// One increment of 1, as a txn: when the ticket is absent, raises a counter-form key's version
// (nested reply 0 succeeded, its put_prev[0]: the key before) or creates an absent key with
// value 1 (nested reply 0 failed, its nested reply 0 succeeded), writing the ticket with it;
// a key holding anything else is left alone (both nested replies failed; their range: the key).
// A failed outer txn: the ticket exists (its range), this increment was applied already.
Json increment_txn(const std::string& key, const std::string& ticket, int64_t lease);

// An add of `delta` by compare-and-set: succeeds when the ticket is absent and the key is as
// `current` read it (nullopt: absent); then the key holds `value + delta` (the ticket with it).
// Its failure branch reads the ticket and the key (in this order).
Json compare_and_add_txn(const std::string& key, const std::string& ticket,
                         const std::optional<KeyValue>& current, int64_t value, int64_t delta,
                         int64_t lease);

}  // namespace ddp::rdzv::etcd
