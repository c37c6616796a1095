//! Approximate agreement in the crash-recovery model with fair-loss links
//! (docs/AGREEMENT.md has the algorithm, the bound and the proof sketch).
//!
//! Every rank starts from its input; in phase `p` it sends its value to
//! every rank (`AGREE_VALUE`, repeated until it moves on: the links only
//! promise that something sent again and again arrives), waits for the
//! values of `n − f` distinct ranks of phase `p`, its own included, and
//! takes the midpoint of their minimum and maximum as its value of `p + 1`.
//! A rank that hears a value of a later phase adopts it and jumps there
//! (catching up instead of waiting for values nobody sends any more). At the
//! last phase `P`, derived from the inputs' bounds and ε, it has decided.
//!
//! Before any value of a new phase leaves, the rank persists (state, phase,
//! counter) in its [`store`]; a rank started again resumes from there and
//! sends, for every phase it took part in, the value it sent before.
//!
//! On the kernel datapath the first program on each rank's interface (TC
//! ingress on the TC hooks, XDP ingress on the XDP hooks: one body,
//! `ebpf/aggbox_agree.h`) folds a phase's values (count,
//! minimum and maximum of order-preserving integer keys; a sender once) and
//! passes one notice up when the quorum is in: one wake-up per phase.

pub mod store;

use std::{
    path::PathBuf,
    time::{Duration, Instant},
};

use crate::{
    comm::{Backoff, Received},
    window::{AgreeArm, AgreeFolded, Windows},
    wire::{AgreeBody, Header, Kind, AGREE_BODY_LEN, FLAG_ANSWER, FLAG_FANOUT, FLAG_RETRANSMIT, HDR_LEN},
    Comm, Datapath, Error, Result,
};
use store::{fnv1a, Identity, Persisted, Store};

/// How long a decided rank keeps answering, by default, for ranks that have
/// not told it they decided too.
pub const DEFAULT_LINGER: Duration = Duration::from_secs(1);
/// First repeat of a phase's value to the ranks not heard from in it: a
/// few phases' time on an idle cluster, so that only losses are repeated.
const RESEND_FIRST: Duration = Duration::from_millis(4);
/// Largest gap between repeats of a phase's value.
const RESEND_MAX: Duration = Duration::from_millis(20);

/// What `agree` is asked to do.
#[derive(Clone, Debug, PartialEq)]
pub struct AgreeConfig {
    /// Every returned value lies within this of every other (> 0).
    pub epsilon: f64,
    /// Ranks that may crash forever: `n ≥ 2f + 1`.
    pub f: usize,
    /// This rank's persistent store (one file per rank and agreement).
    pub store: PathBuf,
    /// How long to wait for a phase's quorum before failing; `None`: the
    /// communicator's timeout.
    pub timeout: Option<Duration>,
    /// Every rank's input lies in `[lo, hi]` (finite, `lo ≤ hi`); the
    /// number of phases follows from `(hi − lo) / epsilon`. The default is
    /// every finite double, which costs about 1045 phases at ε = 1e-6.
    pub lo: f64,
    /// See `lo`.
    pub hi: f64,
    /// How long a decided rank keeps answering ranks that lag behind,
    /// unless every rank said it decided before.
    pub linger: Duration,
}

impl Default for AgreeConfig {
    fn default() -> Self {
        AgreeConfig {
            epsilon: 1e-6,
            f: 0,
            store: PathBuf::new(),
            timeout: None,
            lo: -f64::MAX,
            hi: f64::MAX,
            linger: DEFAULT_LINGER,
        }
    }
}

/// Checks the resilience bound: `n − f` values from distinct ranks must
/// overlap in at least one rank, `2(n − f) > n`, that is `n ≥ 2f + 1`.
pub fn check_bound(n: usize, f: usize) -> Result<()> {
    if n < 2 * f + 1 {
        return Err(Error::InvalidArgument(format!(
            "agreement: {n} ranks cannot tolerate f = {f} ranks crashing forever: the bound is n ≥ 2f + 1 \
             (two quorums of n − f = {} ranks must share a rank), so f ≤ {} here",
            n.saturating_sub(f),
            n.saturating_sub(1) / 2
        )));
    }
    Ok(())
}

/// Phases after which the values of `[lo, hi]`, halved in spread each
/// phase, lie within `epsilon` of each other: the least `P` with
/// `(hi − lo) / 2^P ≤ epsilon`, plus one for rounding (docs/AGREEMENT.md).
pub fn phases(lo: f64, hi: f64, epsilon: f64) -> u32 {
    // Half the spread, which does not overflow even for the widest range.
    let mut half = hi / 2.0 - lo / 2.0;
    let mut p = 0;
    while half > epsilon / 2.0 {
        half /= 2.0;
        p += 1;
    }
    if p == 0 {
        0
    } else {
        p + 1
    }
}

/// The midpoint of `[min, max]`, inside it whatever the rounding.
pub fn midpoint(min: f64, max: f64) -> f64 {
    if min == max {
        return min;
    }
    (min / 2.0 + max / 2.0).clamp(min, max)
}

impl AgreeConfig {
    /// Checks the configuration for `n` ranks and this rank's `input`.
    pub fn validate(&self, n: usize, input: f64) -> Result<()> {
        let bad = |what: String| Err(Error::InvalidArgument(format!("agreement: {what}")));
        if self.epsilon.is_nan() || self.epsilon <= 0.0 || !self.epsilon.is_finite() {
            return bad(format!("epsilon must be a finite number above 0, not {}", self.epsilon));
        }
        if !self.lo.is_finite() || !self.hi.is_finite() || self.lo > self.hi {
            return bad(format!("the input bounds [{}, {}] must be finite with lo ≤ hi", self.lo, self.hi));
        }
        if input.is_nan() {
            return bad("the input is NaN".into());
        }
        if input < self.lo || input > self.hi {
            return bad(format!("the input {input} is outside the bounds [{}, {}]", self.lo, self.hi));
        }
        check_bound(n, self.f)?;
        if self.store.as_os_str().is_empty() {
            return bad("no store path: every rank needs its own persistent store".into());
        }
        Ok(())
    }
}

/// The fold of one phase in user space: who was heard, the extremes.
struct Fold {
    heard: Vec<bool>,
    count: usize,
    min: f64,
    max: f64,
}

impl Fold {
    fn new(n: usize) -> Fold {
        Fold { heard: vec![false; n], count: 0, min: f64::INFINITY, max: f64::NEG_INFINITY }
    }

    fn reset(&mut self, rank: usize, own: f64) {
        self.heard.iter_mut().for_each(|h| *h = false);
        self.count = 0;
        self.min = f64::INFINITY;
        self.max = f64::NEG_INFINITY;
        self.add(rank, own);
    }

    /// Folds `value` from `sender`; false for a repeat.
    fn add(&mut self, sender: usize, value: f64) -> bool {
        if self.heard[sender] {
            return false;
        }
        self.heard[sender] = true;
        self.count += 1;
        self.min = self.min.min(value);
        self.max = self.max.max(value);
        true
    }
}

/// Where one agreement call is.
struct Run {
    seq: u32,
    last: u32,
    quorum: usize,
    phase: u32,
    value: f64,
    counter: u32,
    fold: Fold,
    /// Ranks known to have decided (they sent a value of the last phase).
    decided: Vec<bool>,
    /// The start counter each rank's values last carried.
    incarnation: Vec<u32>,
    /// The kernel folds this rank's phases (the kernel datapath): the quorum and
    /// who was heard are in the window, not in `fold`.
    kernel: bool,
    /// TC egress fans this rank's values out: one send per phase.
    fanout: bool,
}

/// What the communicator keeps of its agreements between calls.
#[derive(Default)]
pub(crate) struct AgreeState {
    /// Agreements begun on this communicator.
    seq: u32,
    /// The last one decided: (seq, last phase, value, counter), answered to
    /// ranks that still ask for it.
    done: Option<(u32, u32, f64, u32)>,
}

impl Comm {
    /// Approximate agreement: every rank passes its input in `value` and
    /// gets back a value within the inputs' range, within `config.epsilon`
    /// of what every other rank gets; up to `config.f` ranks may crash
    /// forever, and every rank may crash and be started again (with the
    /// same rank, address and store) any number of times.
    pub fn agree(&mut self, config: &AgreeConfig, value: f64) -> Result<f64> {
        let n = self.size();
        config.validate(n, value)?;
        self.agree.seq = self.agree.seq.wrapping_add(1);
        let seq = self.agree.seq;
        let identity = Identity {
            rank: self.rank() as u32,
            world: n as u32,
            group: self.group.group,
            token_hash: fnv1a(&self.group.token.to_le_bytes()),
            seq,
            f: config.f as u32,
            epsilon: config.epsilon,
            lo: config.lo,
            hi: config.hi,
        };
        let store = Store::new(&config.store, identity)?;
        let last = phases(config.lo, config.hi, config.epsilon);
        // Resume from the store, or start at phase 0 from the input; the
        // counter goes up before anything is sent.
        let resumed = store.load()?;
        let mut persisted = resumed.unwrap_or(Persisted { state: value, phase: 0, counter: 0 });
        if persisted.phase > last {
            return Err(Error::InvalidArgument(format!(
                "agreement store {}: phase {} is past the last phase {last}",
                store.path().display(),
                persisted.phase
            )));
        }
        persisted.counter = persisted.counter.saturating_add(1);
        store.save(&persisted)?;
        if resumed.is_some() {
            self.user_stats.agree_restarts += 1;
        }
        let mut run = Run {
            seq,
            last,
            quorum: n - config.f,
            phase: persisted.phase,
            value: persisted.state,
            counter: persisted.counter,
            fold: Fold::new(n),
            decided: vec![false; n],
            incarnation: vec![0; n],
            kernel: self.agree_windows().is_some(),
            fanout: self.agree_windows().is_some() && self.fanout_reaches_all(),
        };
        run.decided[self.rank()] = true;
        run.fold.reset(self.rank(), run.value);
        let timeout = config.timeout.unwrap_or(self.timeout());
        self.agree_arm(&run);
        let result = self.agree_run(&store, &mut run, timeout, config.linger);
        if result.is_err() {
            if let Some(windows) = self.agree_windows() {
                windows.disarm_agree();
            }
        }
        if result.is_ok() {
            self.user_stats.agreements += 1;
            self.agree.done = Some((seq, last, run.value, run.counter));
            // Ranks that did not say they decided may be down for good (up
            // to f may): closing the communicator does not wait for them,
            // nor longer than the linger for the others (which may crash
            // after deciding).
            for (rank, decided) in run.decided.iter().enumerate() {
                if !decided {
                    self.failed[rank] = true;
                }
            }
            let wait = config.linger.max(Duration::from_millis(100));
            self.close_wait = Some(self.close_wait.map_or(wait, |w| w.min(wait)));
        }
        result.map(|()| run.value)
    }

    fn agree_run(&mut self, store: &Store, run: &mut Run, timeout: Duration, linger: Duration) -> Result<()> {
        let me = self.rank();
        let n = self.size();
        self.send_agree_all(run, false)?;
        let mut backoff = Backoff::starting(RESEND_FIRST, RESEND_MAX);
        let mut deadline = Instant::now() + timeout;
        let mut linger_until: Option<Instant> = None;
        let mut seen = run.phase;
        loop {
            if let Some((min, max)) = self.agree_quorum(run) {
                // The quorum of this phase is in: the next value.
                self.agree_enter(store, run, run.phase + 1, midpoint(min, max))?;
                self.user_stats.agree_phases += 1;
            }
            if run.phase != seen {
                // Progress (a quorum, or a jump): the timers start again.
                seen = run.phase;
                backoff = Backoff::starting(RESEND_FIRST, RESEND_MAX);
                deadline = Instant::now() + timeout;
            }
            if run.phase == run.last {
                self.agree_note_decided(run);
                let until = *linger_until.get_or_insert_with(|| Instant::now() + linger);
                if (0..n).all(|r| run.decided[r]) || Instant::now() >= until {
                    return Ok(());
                }
            }
            if backoff.fire() {
                self.send_agree_all(run, true)?;
            }
            let wait = backoff.due().min(linger_until.unwrap_or(deadline));
            let Some(got) = self.recv_valid(wait)? else {
                if linger_until.is_none() && Instant::now() >= deadline {
                    let missing: Vec<usize> = (0..n).filter(|&r| !self.agree_heard(run, r)).collect();
                    let names: Vec<String> = missing.iter().map(|r| r.to_string()).collect();
                    return Err(Error::PeerFailed {
                        rank: missing.first().copied().unwrap_or(me),
                        what: format!(
                            "agreement #{} phase {} of {}: {} of the {} values a phase needs arrived within {} ms; \
                             nothing from rank(s) {} (more than f of them are down)",
                            run.seq,
                            run.phase,
                            run.last,
                            (0..n).filter(|&r| self.agree_heard(run, r)).count(),
                            run.quorum,
                            timeout.as_millis(),
                            names.join(", ")
                        ),
                    });
                }
                continue;
            };
            match got.kind {
                Kind::AgreeValue if got.header.seq == run.seq => self.agree_on_value(store, run, &got)?,
                Kind::AgreeValue => self.agree_answer_old(&got)?,
                // XDP's notice that this phase's quorum is in the window
                // (checked at the top of the loop).
                Kind::AgreeQuorum if run.kernel && got.header.seq == run.seq => {
                    self.user_stats.agree_quorums_from_kernel += 1;
                }
                Kind::AgreeQuorum if run.kernel => self.user_stats.duplicates += 1,
                Kind::AgreeQuorum => self.user_stats.dropped_malformed += 1,
                _ => {
                    self.serve_stale(&got)?;
                }
            }
        }
    }

    /// Handles a value of this agreement from another rank.
    fn agree_on_value(&mut self, store: &Store, run: &mut Run, got: &Received) -> Result<()> {
        let Some(body) = AgreeBody::from_bytes(self.payload(got)) else {
            self.user_stats.dropped_malformed += 1;
            return Ok(());
        };
        let value = f64::from_bits(body.value);
        let (sender, phase) = (got.header.sender as usize, got.header.chunk);
        if got.header.nchunks != run.last {
            return Err(Error::Mismatch(format!(
                "agreement #{}: rank {sender} runs it in {} phases, this rank in {}: every rank must pass the same epsilon and bounds",
                run.seq, got.header.nchunks, run.last
            )));
        }
        if phase > run.last || value.is_nan() {
            self.user_stats.dropped_malformed += 1;
            return Ok(());
        }
        self.user_stats.agree_values_received += 1;
        // Its counter went up since we last heard from it: it restarted and
        // lost what it had received (docs/AGREEMENT.md, "The counter").
        let restarted = run.incarnation[sender] != 0 && body.incarnation > run.incarnation[sender];
        run.incarnation[sender] = run.incarnation[sender].max(body.incarnation);
        if phase == run.last {
            run.decided[sender] = true;
        }
        if phase > run.phase {
            // A later phase: adopt its value and catch up.
            self.user_stats.agree_jumps += 1;
            self.agree_enter(store, run, phase, value)?;
            return Ok(());
        }
        if phase < run.phase {
            // The sender lags: tell it where we are (unless this is itself
            // an answer, which is not answered in turn).
            if got.header.flags & FLAG_ANSWER == 0 || restarted {
                self.send_agree(run, sender, FLAG_ANSWER)?;
                self.user_stats.agree_answers_sent += 1;
            }
            return Ok(());
        }
        let repeat = match self.agree_windows().filter(|_| run.kernel) {
            // XDP passed it up (it lost the race for the window's keys, or
            // came before this phase was armed): folded the way XDP folds.
            Some(windows) => !matches!(
                windows.fold_agree(run.seq, phase, sender, value),
                AgreeFolded::Folded | AgreeFolded::Quorum
            ),
            None => !run.fold.add(sender, value),
        };
        if repeat {
            self.user_stats.duplicates += 1;
        }
        let repeated_final = phase == run.last && got.header.flags & (FLAG_RETRANSMIT | FLAG_ANSWER) == FLAG_RETRANSMIT;
        if (restarted && phase < run.last) || repeated_final {
            // It lost what it had received (our value of this phase again),
            // or it decided and repeats its final value because it has not
            // heard that we decided too (XDP answers the same way).
            self.send_agree(run, sender, FLAG_ANSWER)?;
            self.user_stats.agree_answers_sent += 1;
        }
        Ok(())
    }

    /// Moves to `phase` with `value`: persisted first, then sent to all.
    fn agree_enter(&mut self, store: &Store, run: &mut Run, phase: u32, value: f64) -> Result<()> {
        store.save(&Persisted { state: value, phase, counter: run.counter })?;
        run.phase = phase;
        run.value = value;
        run.fold.reset(self.rank(), value);
        // Armed after the store, since XDP answers laggers with the value.
        self.agree_arm(run);
        self.send_agree_all(run, false)
    }

    /// Sends this rank's value of its phase to every other rank; decided,
    /// its final value to every other rank, and repeats of it to every rank
    /// not known to have decided.
    ///
    /// Every rank, not only those not heard from in the phase: having heard
    /// from a rank says nothing of whether it heard from us, and three
    /// ranks that each heard only the next one would wait for each other
    /// forever.
    fn send_agree_all(&mut self, run: &Run, retransmit: bool) -> Result<()> {
        let flags = if retransmit { FLAG_RETRANSMIT } else { 0 };
        let n = self.size();
        if run.fanout && run.phase != run.last && n > 2 {
            // One datagram: TC egress clones it to every other rank.
            self.send_agree(run, (self.rank() + 1) % n, flags | FLAG_FANOUT)?;
            self.user_stats.agree_fanouts += 1;
            if retransmit {
                self.user_stats.retransmits += 1;
            }
            return Ok(());
        }
        for rank in 0..n {
            // Decided: the first send goes to every rank, even those known
            // to have decided, which may not know that this one did; the
            // repeats only to those not known to have decided.
            let needed = run.phase != run.last || !retransmit || !run.decided[rank];
            if rank != self.rank() && needed {
                self.send_agree(run, rank, flags)?;
                if retransmit {
                    self.user_stats.retransmits += 1;
                }
            }
        }
        Ok(())
    }

    /// The kernel agreement window, on the kernel datapath (the first
    /// program on the interface, XDP or TC ingress, folds agreement values).
    fn agree_windows(&self) -> Option<&Windows> {
        self.attachment
            .as_ref()
            .and_then(|a| a.windows())
            .filter(|_| self.datapath() == Datapath::Kernel)
    }

    /// Arms the window for `run`'s phase (XDP folds it, and answers laggers
    /// with its value); decided, it keeps answering with the final value
    /// and records who else decided, until the next agreement.
    fn agree_arm(&self, run: &Run) {
        if let Some(windows) = self.agree_windows().filter(|_| run.kernel) {
            windows.arm_agree(&AgreeArm {
                seq: run.seq,
                phase: run.phase,
                last: run.last,
                quorum: if run.phase == run.last { u32::MAX } else { run.quorum as u32 },
                rank: self.rank() as u32,
                value: run.value,
                incarnation: run.counter,
            });
        }
    }

    /// The (min, max) of the running phase's quorum, once it is in.
    fn agree_quorum(&self, run: &Run) -> Option<(f64, f64)> {
        if run.phase >= run.last {
            return None;
        }
        match self.agree_windows().filter(|_| run.kernel) {
            Some(windows) => {
                let fold = windows.agree_fold();
                (fold.seq == run.seq && fold.phase == run.phase && fold.count as usize >= run.quorum)
                    .then_some((fold.min, fold.max))
            }
            None => (run.fold.count >= run.quorum).then_some((run.fold.min, run.fold.max)),
        }
    }

    /// Whether `rank`'s value of the running phase was folded.
    fn agree_heard(&self, run: &Run, rank: usize) -> bool {
        match self.agree_windows().filter(|_| run.kernel) {
            Some(windows) => {
                let fold = windows.agree_fold();
                fold.seq == run.seq && fold.phase == run.phase && fold.senders[rank / 64] & (1 << (rank % 64)) != 0
            }
            None => run.fold.heard[rank],
        }
    }

    /// Decided on the kernel datapath: the final values XDP folded say who
    /// else decided.
    fn agree_note_decided(&self, run: &mut Run) {
        if let Some(windows) = self.agree_windows().filter(|_| run.kernel) {
            let fold = windows.agree_fold();
            if fold.seq == run.seq && fold.phase == run.last {
                for (rank, decided) in run.decided.iter_mut().enumerate() {
                    *decided |= fold.senders[rank / 64] & (1 << (rank % 64)) != 0;
                }
            }
        }
    }

    fn send_agree(&mut self, run: &Run, rank: usize, flags: u16) -> Result<()> {
        self.send_agree_value(run.seq, run.phase, run.last, run.value, run.counter, rank, flags)
    }

    #[allow(clippy::too_many_arguments)]
    fn send_agree_value(
        &mut self,
        seq: u32,
        phase: u32,
        last: u32,
        value: f64,
        counter: u32,
        rank: usize,
        flags: u16,
    ) -> Result<()> {
        let mut header: Header = self.header(Kind::AgreeValue, seq);
        header.chunk = phase;
        header.nchunks = last;
        header.count = 1;
        header.dtype = crate::Dtype::F64.code();
        header.flags = flags;
        let mut datagram = [0u8; HDR_LEN + AGREE_BODY_LEN];
        header.write_to(&mut datagram);
        datagram[HDR_LEN..].copy_from_slice(&AgreeBody { value: value.to_bits(), incarnation: counter, reserved: 0 }.to_bytes());
        self.transport.send(&datagram, self.group.peers[rank].addr())?;
        self.user_stats.packets_sent += 1;
        Ok(())
    }

    /// Answers a value of an earlier agreement with that agreement's
    /// decided value, if it is the last one this communicator decided.
    fn agree_answer_old(&mut self, got: &Received) -> Result<()> {
        match self.agree.done {
            Some((seq, last, value, counter)) if got.header.seq == seq && got.header.flags & FLAG_ANSWER == 0 => {
                self.send_agree_value(seq, last, last, value, counter, got.header.sender as usize, FLAG_ANSWER)?;
                self.user_stats.agree_answers_sent += 1;
            }
            _ => self.user_stats.duplicates += 1,
        }
        Ok(())
    }

    /// Answers an agreement datagram that arrives during another operation
    /// (see [`Comm::serve_stale`]).
    pub(crate) fn serve_stale_agree(&mut self, got: &Received) -> Result<bool> {
        if got.kind != Kind::AgreeValue {
            return Ok(false);
        }
        self.agree_answer_old(got)?;
        Ok(true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_bound_is_n_at_least_2f_plus_1() {
        for n in 1..=9usize {
            for f in 0..=n {
                let plain = 2 * f < n;
                assert_eq!(check_bound(n, f).is_ok(), plain, "n {n} f {f}");
            }
        }
        let err = check_bound(4, 2).unwrap_err().to_string();
        assert!(err.contains("n ≥ 2f + 1") && err.contains("f ≤ 1"), "{err}");
    }

    #[test]
    fn phases_halve_the_bounds_down_to_epsilon() {
        for (lo, hi, eps) in [(0.0, 1e6, 1e-6), (-3.0, 5.0, 0.5), (0.0, 1.0, 1.0), (1.0, 1.0, 1e-9), (-f64::MAX, f64::MAX, 1e-6)] {
            let p = phases(lo, hi, eps);
            // Plain reference: the least q with (hi − lo) / 2^q ≤ eps, in
            // halves so that the widest range does not overflow.
            let mut q = 0u32;
            let mut spread_half = hi / 2.0 - lo / 2.0;
            while spread_half * 2.0 > eps {
                spread_half /= 2.0;
                q += 1;
            }
            assert_eq!(p, if q == 0 { 0 } else { q + 1 }, "[{lo}, {hi}] eps {eps}");
        }
        assert_eq!(phases(0.0, 1e6, 1e-6), 41);
    }

    #[test]
    fn the_midpoint_stays_inside() {
        let tiny = f64::from_bits(1);
        for (a, b) in [(0.0, 1.0), (-f64::MAX, f64::MAX), (tiny, tiny), (tiny, 2.0 * tiny), (-0.0, 0.0), (1e300, 1e300)] {
            let m = midpoint(a, b);
            assert!(m >= a && m <= b, "{a} {b} -> {m}");
        }
        assert_eq!(midpoint(2.0, 4.0), 3.0);
    }

    /// A fresh directory for the stores of one test.
    fn store_dir(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("aggbox-agree-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[test]
    fn five_loopback_ranks_agree_within_epsilon_inside_the_inputs_range() {
        let dir = store_dir("five");
        let inputs = [0.0, 1e6, 250_000.5, 999_999.0, 3.25];
        let d = dir.clone();
        let got = crate::comm::testing::ranks(5, 29_677, 10_000, move |rank, comm| {
            let config = AgreeConfig { f: 2, lo: 0.0, hi: 1e6, store: d.join(format!("rank{rank}")), ..AgreeConfig::default() };
            let value = comm.agree(&config, inputs[rank]).unwrap();
            (value, comm.stats().unwrap().user)
        });
        let (lo, hi) = inputs.iter().fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), &x| (a.min(x), b.max(x)));
        for (i, (a, stats)) in got.iter().enumerate() {
            assert!(*a >= lo && *a <= hi, "rank {i}: {a} outside [{lo}, {hi}]");
            for (b, _) in &got {
                assert!((a - b).abs() <= 1e-6, "{a} and {b} differ by more than epsilon");
            }
            assert_eq!(stats.agreements, 1);
            assert_eq!(stats.agree_phases + stats.agree_jumps, u64::from(phases(0.0, 1e6, 1e-6)), "rank {i}");
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn more_than_f_ranks_gone_is_an_error_naming_one_within_the_timeout() {
        let dir = store_dir("gone");
        let d = dir.clone();
        let got = crate::comm::testing::ranks(3, 29_679, 5_000, move |rank, comm| {
            if rank != 0 {
                return None; // ranks 1 and 2 leave before the agreement
            }
            let config = AgreeConfig {
                f: 1,
                lo: 0.0,
                hi: 1.0,
                timeout: Some(Duration::from_millis(700)),
                store: d.join("rank0"),
                ..AgreeConfig::default()
            };
            let start = Instant::now();
            let result = comm.agree(&config, 0.5);
            Some((result, start.elapsed()))
        });
        let (result, took) = got[0].as_ref().unwrap();
        match result {
            Err(Error::PeerFailed { rank, what }) => {
                assert!(*rank == 1 || *rank == 2, "{rank}: {what}");
                assert!(what.contains("phase 0") && what.contains("1 of the 2 values"), "{what}");
            }
            other => panic!("expected PeerFailed, got {other:?}"),
        }
        assert!(*took < Duration::from_secs(3), "gave up after {took:?}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn ranks_with_another_epsilon_are_a_mismatch_on_every_rank() {
        let dir = store_dir("mismatch");
        let d = dir.clone();
        let got = crate::comm::testing::ranks(3, 29_678, 5_000, move |rank, comm| {
            let epsilon = if rank == 2 { 1e-3 } else { 1e-6 };
            let config = AgreeConfig {
                f: 1,
                epsilon,
                lo: 0.0,
                hi: 1.0,
                timeout: Some(Duration::from_secs(2)),
                store: d.join(format!("rank{rank}")),
                ..AgreeConfig::default()
            };
            comm.agree(&config, rank as f64 / 2.0).map_err(|e| e.to_string())
        });
        for (rank, result) in got.iter().enumerate() {
            let err = result.as_ref().unwrap_err();
            assert!(err.contains("mismatched") && err.contains("same epsilon and bounds"), "rank {rank}: {err}");
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn bad_configurations_are_refused_with_a_message() {
        let ok = AgreeConfig { store: "/tmp/x".into(), f: 2, ..AgreeConfig::default() };
        assert!(ok.validate(5, 1.0).is_ok());
        for (config, input, what) in [
            (AgreeConfig { epsilon: 0.0, ..ok.clone() }, 1.0, "epsilon"),
            (AgreeConfig { epsilon: -1.0, ..ok.clone() }, 1.0, "epsilon"),
            (AgreeConfig { epsilon: f64::NAN, ..ok.clone() }, 1.0, "epsilon"),
            (ok.clone(), f64::NAN, "NaN"),
            (AgreeConfig { lo: 0.0, hi: 1.0, ..ok.clone() }, 2.0, "outside"),
            (AgreeConfig { lo: 1.0, hi: 0.0, ..ok.clone() }, 0.5, "lo ≤ hi"),
            (AgreeConfig { f: 3, ..ok.clone() }, 1.0, "2f + 1"),
            (AgreeConfig { store: PathBuf::new(), ..ok.clone() }, 1.0, "store"),
        ] {
            let err = config.validate(5, input).unwrap_err().to_string();
            assert!(err.contains(what), "{what}: {err}");
        }
    }
}
