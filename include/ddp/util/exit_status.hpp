#pragma once
// Exit statuses with a meaning shared by a trainer, ddprun and a job script.

namespace ddp {

// The trainer stopped on request (a preemption or time-limit signal, ddp::StopRequest) after
// writing a checkpoint every rank agreed on, and asks to be started again later, where that
// checkpoint resumes it. sysexits.h's EX_TEMPFAIL ("temporary failure, try again later").
// ddprun does not count it as a failure: it waits for the other workers, does not restart the
// group, and exits with it when no worker failed (also after forwarding SIGTERM, when every
// worker exited with it). deploy/slurm-*.sbatch turn it into `scontrol requeue`.
inline constexpr int kRequeueExitStatus = 75;

}  // namespace ddp
