#pragma once
// The membership notice of in-place recovery (ddprun --recovery step, docs/recovery.md): how
// the launcher tells the workers of a job, through the job's store, that a rank was lost.
//
// Keys (under kRecoveryPrefix):
//   generation        the membership generation, an add() counter: 0 (absent) at the start,
//                     +1 for every rank lost. Read with add(key, 0): one round trip, no wait.
//   lost/<g>          what opened generation g, set before the counter reaches g, so a reader
//                     that saw g finds it:
//                       "<r>"            rank slot r was lost and is restarted in place (the
//                                        membership stays the same);
//                       "node:<r>,<s>.." the ranks slots r, s, ... were lost with their node
//                                        and leave the job: the survivors go on without them;
//                       "join:<r>,<s>.." a node that joined the running job took the slots
//                                        r, s, ... a lost node left, or new slots past every
//                                        earlier one (it grew the job beyond its launch
//                                        size): its new workers come in them (healed from a
//                                        peer), the others make room.
//                       "left:<r>"       --recovery shrink: rank slot r was lost and is
//                                        restarted; the others go on without it at once
//                                        (a removal, as "node:", until...)
//                       "back:<r>"       ...its replacement, started and ready, claims the
//                                        slot back (an addition, as "join:"; written by that
//                                        worker's RecoverableGroup, not by a launcher).
//   finished/<r>      the process in rank slot r closed its group without an error (its
//                     training is over) while a member of generation "<g>", the value; it
//                     never joins a later generation. Written by that process
//                     (RecoverableGroup's destructor); emptied ("") when the slot forms a
//                     group again in the same process.
//   finish_count      an add() counter, +1 for every finished/<r> written: a waiter reads the
//                     slots' records only once it is above 0 (one round trip per poll).
//   step_managers     an add() counter, +1 for every process whose training loop runs under a
//                     StepManager (C++ or Python), which redoes a step a lost rank dropped.
//                     The launcher restarts a lost rank alone only when it is above 0;
//                     otherwise nothing would redo the survivors' step (they wait in their
//                     collective) and it restarts the whole group instead.
//
// A rank's slot is the RANK it was launched with; it never changes. Its rank in generation g is
// its index among the slots of g (members()): the launch's 0..W-1 minus every slot a "node:"
// record up to g removed and no later "join:" record gave back, plus the slots W and above that
// a "join:" record added (a node that grew the job) and no later "node:" record removed, in
// slot order. So the membership of
// any generation follows from the records alone, whatever order concurrent writers claimed them in.
// A finished/<r> record speaks for the process that wrote it only: once a record of a later
// generation than its "<g>" names slot r (restarted in place, lost with its node, taken back by
// a joining node), slot r is another process's now and the record is stale (finished_slots).
// So a replacement or a new node's worker never reads as finished, whatever order the writers
// ran in.
//
// The launchers (one agent per node) are the only writers of generation and lost/<g>: each
// claims the next free lost/<g> with compare_set, then raises the counter, so the keys
// lost/1..lost/k are all set whenever the counter reads k, even when agents on two nodes record
// losses at the same moment. Workers read the counter from a watcher thread (RecoverableGroup),
// never on the training step's path.

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "ddp/store/store.hpp"
#include "ddp/store/wait_interrupter.hpp"

namespace ddp::recovery_notice {

inline constexpr const char* kRecoveryPrefix = "ddp/recovery/";

// Set by ddprun for its workers on several nodes: how long a worker whose collective failed
// (a peer's socket closed) waits for the notice before it takes the error for something else
// (milliseconds; StepManagerOptions::notice_wait's default). A lost node is announced only
// after its heartbeats were missed, which may take longer than a lost worker's notice.
inline constexpr const char* kNoticeWaitEnvVar = "DDP_RECOVERY_NOTICE_WAIT_MS";

// Set by ddprun --recovery step for every worker: the job's world size at launch, the same on
// every node (members()' initial_world_size). A worker of a node that grew the job past it has
// a RANK at or above it and a WORLD_SIZE that counts every slot up to its node's.
inline constexpr const char* kLaunchWorldSizeEnvVar = "DDP_RECOVERY_LAUNCH_WORLD_SIZE";

// The current generation (0 when no rank was lost yet).
int64_t read_generation(Store& store);

// Waits until the record of `generation` (lost/<g>) is set (kSet) or `timeout` passed
// (kTimedOut): a blocking wait in the store, so a watcher learns of a new generation one round
// trip after its writer claimed it. The counter may still read g - 1 for a moment after (the
// writer raises it next). With `interrupter`, a store that offers InterruptibleWait (TcpStore)
// ends the wait soon after interrupter->interrupt() (kInterrupted); other stores wait on.
WaitOutcome wait_for_record(Store& store, int64_t generation, std::chrono::milliseconds timeout,
                            WaitInterrupter* interrupter = nullptr);

// The (first) rank slot whose loss opened `generation`, or nullopt when not recorded
// (generation 0).
std::optional<int> read_lost_rank(Store& store, int64_t generation);

// What opened a generation's record (lost/<g>).
enum class RecordKind {
  kRestart,     // "<r>": restarted in place
  kNodeLost,    // "node:..."
  kNodeJoined,  // "join:..."
  kRankLeft,    // "left:<r>" (--recovery shrink)
  kRankBack,    // "back:<r>" (--recovery shrink)
};
// nullopt for generation 0 or a record not written yet.
std::optional<RecordKind> read_record_kind(Store& store, int64_t generation);

// The slots that `generation` removed: lost with their node, or a lost rank under --recovery
// shrink (empty for an in-place restart).
std::vector<int> read_removed_slots(Store& store, int64_t generation);

// The slots that came in at `generation`: a joining node's, or a replacement back under
// --recovery shrink (empty otherwise).
std::vector<int> read_joined_slots(Store& store, int64_t generation);

// The rank slots of `generation`, in rank order: slot members(...)[i] has rank i. Reads the
// records of generations 1..generation (one round trip each: for re-forming, not per step).
// `initial_world_size` is the launch's world size, the same in every process (a node that grew
// the job knows it from DDP_RECOVERY_LAUNCH_WORLD_SIZE): slots from it on are members only once
// a "join:" record added them.
std::vector<int> members(Store& store, int64_t generation, int initial_world_size);

// Whether a "node:" record of a generation in (after, upto] removed `slot`. A process (or an
// agent) that was in the job at generation `after` is out for good then, even when a later
// "join:" record gave the slot back: to a new node's processes, not to it.
bool removed_between(Store& store, int slot, int64_t after, int64_t upto);

// Whether the newest record up to `generation` that names `slot` is a "left:" one: a rank lost
// under --recovery shrink, whose replacement (this process, when it asks) claims it back.
bool awaits_return(Store& store, int slot, int64_t generation);
// Launcher side: records that `rank` was lost and opens the next generation, which it returns
// (the generation whose lost/<g> key it claimed; the counter may already be higher when
// another node's agent recorded a loss at the same time).
int64_t publish_lost_rank(Store& store, int rank);

// Launcher side: records that the ranks `slots` (non-empty) were lost with their node and
// leave the job; returns the generation it opened, as publish_lost_rank.
int64_t publish_lost_node(Store& store, const std::vector<int>& slots);

// --recovery shrink. Launcher side: records that `rank` was lost and leaves the membership at
// once (the survivors go on without it); its replacement, worker side, once it runs: records
// that `rank` is back. Each returns the generation it opened, as publish_lost_rank.
int64_t publish_rank_left(Store& store, int rank);
int64_t publish_rank_back(Store& store, int rank);

// Launcher side (the joining node's agent, before it starts its workers): records that the
// slots `slots` (non-empty; each removed by an earlier "node:" record, or past every slot the
// job had: the node grew it) come with a node that joined the running job; returns the
// generation it opened, as publish_lost_rank.
int64_t publish_joined_node(Store& store, const std::vector<int>& slots);

// Worker side (RecoverableGroup's destructor), and ddprun's agent when a worker exits 0 (it may
// skip its destructors: exit(), _Exit): records that the process in `slot`, a member of
// `generation` (the last one it formed; the agent gives the current one), finished without an
// error and will not join any later generation. Two round trips.
void publish_finished(Store& store, int slot, int64_t generation);

// Worker side (a RecoverableGroup constructed in `slot` again, in the same process): the slot's
// earlier record no longer holds. One round trip.
void clear_finished(Store& store, int slot);

// How many finished/<r> records were ever written (0: none, so no slot finished). One round
// trip, no wait.
int64_t read_finish_count(Store& store);

// A StepManager drives this process's training loop (step_managers above).
void announce_step_manager(Store& store);
// Whether any process of the job announced one. One round trip, no wait.
bool step_manager_announced(Store& store);

// The slots among `slots` whose process finished (publish_finished) and that no process will
// take back: a record written at generation gw that no record of a generation in (gw, newest]
// overrides (one naming the slot: an in-place restart, a lost node, a joining node). In the
// order of `slots`. Reads the counter and each slot's record, and the generation records after
// it for those that have one: for a waiter that saw read_finish_count() above 0, not per step.
std::vector<int> finished_slots(Store& store, const std::vector<int>& slots);

}  // namespace ddp::recovery_notice
