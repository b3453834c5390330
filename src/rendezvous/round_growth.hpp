#pragma once
// Growing a running round (ddprun --recovery step, docs/recovery.md "Growing past the launch
// size"). Internal to src/rendezvous.
//
// A round forms with `formed` nodes in slots 0 .. formed - 1. A node that joins while it runs,
// with no lost place to take and the round below its maximum, grows it in its own join slot
// (the join counter's value, unique and at least `formed`): its info and first heartbeat are in
// node/<slot> and hb/<slot> from its join, it sets rank/<slot> (its first global rank, after the
// round's world size and the ranks earlier growers brought) once it is a member, then raises
// "extent" past its slot. Join slots of nodes that did not grow (they took a lost place, waited
// for the next round, or found the round full) stay holes: no rank/<slot>. So a slot at or past
// `formed` is a member exactly when its rank key is set, and every member is below "extent".
//
// The round's live nodes: formed + grown - withdrawn - lost + back (its counters).

#include <cstdint>
#include <optional>
#include <vector>

#include "ddp/store/store.hpp"
#include "keys.hpp"

namespace ddp::rdzv {

// The round's extent (1 + its highest member slot); `formed` until the round's node 0 published
// it. Two round trips (a check first: a get would wait for a key that is not there).
int read_extent(Store& store, const keys::Round& k, int formed);

// Raises the round's extent to at least `to` (compare_set: concurrent growers never lower it).
void raise_extent(Store& store, const keys::Round& k, int to);

// Whether the join slot `slot` (at or past `formed`) holds a member that grew the round.
bool is_grown_member(Store& store, const keys::Round& k, int slot);

// The round's members' slots in order: 0 .. formed - 1, then every grown member below the
// extent. Two round trips, plus one per slot past `formed`.
std::vector<int> round_members(Store& store, const keys::Round& k, int formed);

// The round's live nodes now, from its counters (four round trips). `lost`: the loss count
// to use (the value an add() of this caller returned, so that losses taken at once by several
// callers each see their own); nullopt: read it.
int64_t live_nodes(Store& store, const keys::Round& k, int formed,
                   std::optional<int64_t> lost = std::nullopt);

}  // namespace ddp::rdzv
