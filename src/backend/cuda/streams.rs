//! Which CUDA stream each step of a plan runs on, and which steps it waits for. Steps that do
//! not depend on each other (a ResNet block's downsampling shortcut beside its 1x1 and 3x3
//! convs, an ASPP head's parallel convs) go on auxiliary streams, so that the captured graph
//! runs them side by side, as TensorRT's auxiliary streams do: a small layer leaves much of
//! the GPU idle while it ramps up and drains (on an H200, ResNet-50's INT8 engine gained 4 %
//! at batch 1; at batch 32, where each branch fills the GPU, nothing measurable). Nothing here
//! touches a GPU.
//!
//! A step waits for the steps that wrote what it reads, and also for the last writer and the
//! readers of the buffer it overwrites: `plan::assign_buffers` shares a buffer between tensors
//! whose lifetimes do not overlap in plan order, and across streams plan order is not time order.

use std::collections::HashMap;

use super::plan::Plan;

/// Stream of each step and the waits before it.
#[derive(Clone, Debug, PartialEq)]
pub struct Schedule {
    /// Stream of each step: 0 is the main stream, 1.. the auxiliary ones.
    pub stream: Vec<usize>,
    /// Steps on other streams that each step waits for: the latest one it needs on each, left
    /// out where an earlier wait already orders it.
    pub waits: Vec<Vec<usize>>,
    /// Streams used, the main one included.
    pub streams: usize,
    /// Vector clock after each step: the latest step of each stream it is ordered after.
    clock: Vec<Vec<Option<usize>>>,
}

impl Schedule {
    /// Whether some step waits for step `s` (an event must be recorded after it).
    pub fn signalled(&self) -> Vec<bool> {
        let mut v = vec![false; self.stream.len()];
        for w in self.waits.iter().flatten() {
            v[*w] = true;
        }
        v
    }

    /// Whether step `a` (before `b` in plan order) finishes before step `b` starts: through
    /// stream order and the waits, transitively.
    pub fn before(&self, a: usize, b: usize) -> bool {
        a < b && self.clock[b][self.stream[a]].is_some_and(|w| w >= a)
    }

    /// Steps off the main stream.
    pub fn aux_steps(&self) -> usize {
        self.stream.iter().filter(|&&s| s != 0).count()
    }
}

/// Schedules `plan`'s steps on the main stream and up to `aux` auxiliary ones. `slot_of` is
/// `assign_buffers`'s buffer of each tensor; `movable[s]`: step `s` may leave the main stream
/// (it uses none of the engine-wide scratch that only the main stream owns).
///
/// A step continues the stream of a producer that was the last step put on its stream (the
/// main stream first), so a chain of layers stays on one stream; a step whose producers'
/// streams have all moved on starts a branch, on the auxiliary stream that has been idle the
/// longest in plan order.
pub fn schedule(plan: &Plan, slot_of: &[usize], movable: &[bool], aux: usize) -> Schedule {
    let n = plan.steps.len();
    let lanes = aux + 1;
    let mut stream = vec![0usize; n];
    let mut waits = vec![vec![]; n];
    let mut last_on: Vec<Option<usize>> = vec![None; lanes];
    // Per buffer: its last writer, and the steps that read it since.
    let mut writer: HashMap<usize, usize> = HashMap::new();
    let mut readers: HashMap<usize, Vec<usize>> = HashMap::new();
    // known[k][j]: the latest step of stream j that stream k is ordered after so far (vector
    // clocks), to leave out waits an earlier wait implies; at[s]: stream k's clock after s.
    let mut known: Vec<Vec<Option<usize>>> = vec![vec![None; lanes]; lanes];
    let mut at: Vec<Vec<Option<usize>>> = Vec::with_capacity(n);
    for (s, step) in plan.steps.iter().enumerate() {
        let ins: Vec<usize> = step.inputs().iter().map(|&t| slot_of[t]).collect();
        let out = slot_of[step.output()];
        let producers: Vec<usize> = ins.iter().filter_map(|b| writer.get(b).copied()).collect();
        let lane = if !movable[s] || last_on[0].is_none() {
            0
        } else if let Some(k) = producers
            .iter()
            .map(|&p| stream[p])
            .filter(|&k| producers.iter().any(|&p| last_on[k] == Some(p)))
            .min()
        {
            k
        } else {
            (1..lanes).min_by_key(|&k| last_on[k]).unwrap_or(0)
        };
        stream[s] = lane;
        // Read after write, write after write, write after read.
        let mut deps = producers;
        deps.extend(writer.get(&out).copied());
        deps.extend(readers.get(&out).into_iter().flatten().copied());
        let mut latest: Vec<Option<usize>> = vec![None; lanes];
        for d in deps {
            let k = stream[d];
            if k != lane && known[lane][k].is_none_or(|w| w < d) {
                latest[k] = latest[k].max(Some(d));
            }
        }
        for (k, d) in latest.into_iter().enumerate() {
            let Some(d) = d else { continue };
            waits[s].push(d);
            for j in 0..lanes {
                known[lane][j] = known[lane][j].max(at[d][j]);
            }
            known[lane][k] = known[lane][k].max(Some(d));
        }
        known[lane][lane] = Some(s);
        at.push(known[lane].clone());
        for b in ins {
            readers.entry(b).or_default().push(s);
        }
        writer.insert(out, s);
        readers.remove(&out);
        last_on[lane] = Some(s);
    }
    let streams = stream.iter().max().map_or(1, |m| m + 1);
    Schedule {
        stream,
        waits,
        streams,
        clock: at,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::Precision;
    use crate::backend::cuda::ops::tests::plan_of;
    use crate::backend::cuda::plan::{Step, assign_buffers};
    use crate::model::proto::int_attr;
    use crate::model::testing::{GraphBuilder, residual_classifier};

    /// A ResNet downsampling bottleneck: 1x1 -> 3x3 -> 1x1 beside a 1x1 shortcut, added. The
    /// shortcut's output is as large as conv1's, whose buffer is free once conv2 has read it
    /// in plan order: a buffer the shortcut may not take while it runs beside conv2.
    fn downsampling_block() -> GraphBuilder {
        let mut b = GraphBuilder::new(&[1, 3, 16, 16]);
        let stem = b.conv("stem", "x", 3, 8, 3);
        let r = b.op("Relu", "stem.relu", &[&stem]);
        let c1 = b.conv("block.conv1", &r, 8, 16, 1);
        let r1 = b.op("Relu", "block.relu1", &[&c1]);
        let c2 = b.conv("block.conv2", &r1, 16, 16, 3);
        let r2 = b.op("Relu", "block.relu2", &[&c2]);
        let c3 = b.conv("block.conv3", &r2, 16, 16, 1);
        let sc = b.conv("block.shortcut", &r, 8, 16, 1);
        let add = b.op("Add", "block.add", &[&c3, &sc]);
        let r3 = b.op("Relu", "block.relu3", &[&add]);
        let y = b.head(&r3, 16, 4);
        b.output(&y);
        b
    }

    /// Three parallel convs on one input, concatenated (an ASPP head).
    fn three_branches() -> GraphBuilder {
        let mut b = GraphBuilder::new(&[1, 3, 16, 16]);
        let stem = b.conv("stem", "x", 3, 8, 3);
        let a = b.conv("a", &stem, 8, 8, 1);
        let c = b.conv("b", &stem, 8, 8, 3);
        let d = b.conv("c", &stem, 8, 8, 3);
        let cat = b.node("Concat", "cat", &[&a, &c, &d], vec![int_attr("axis", 1)]);
        let cat = b.op("Relu", "cat.relu", &[&cat]);
        let y = b.head(&cat, 24, 4);
        b.output(&y);
        b
    }

    fn step_named(plan: &Plan, name: &str) -> usize {
        plan.steps
            .iter()
            .position(|s| s.name() == name)
            .unwrap_or_else(|| panic!("no step {name}"))
    }

    /// Whether step `a` finishes before step `b` starts: stream order plus the waits, followed
    /// step by step (not through the clocks `Schedule::before` keeps).
    fn ordered(sch: &Schedule, a: usize, b: usize) -> bool {
        let mut reach = vec![false; sch.stream.len()];
        reach[a] = true;
        for s in a + 1..=b {
            let after_own = (a..s)
                .rev()
                .any(|p| reach[p] && sch.stream[p] == sch.stream[s]);
            reach[s] = after_own || sch.waits[s].iter().any(|&w| reach[w]);
        }
        reach[b]
    }

    /// Buffers as the engine assigns them: ordered by a draft schedule on unshared buffers,
    /// then the schedule on the shared ones. Checks that the clocks agree with the waits.
    fn scheduled(plan: &Plan, movable: &[bool], aux: usize) -> (Vec<usize>, Schedule) {
        let roots: Vec<usize> = (0..plan.tensors.len()).map(|t| plan.root(t)).collect();
        let draft = schedule(plan, &roots, movable, aux);
        let (slot_of, _) = assign_buffers(plan, |a, b| draft.before(a, b));
        let sch = schedule(plan, &slot_of, movable, aux);
        for b in 0..plan.steps.len() {
            for a in 0..b {
                assert_eq!(sch.before(a, b), ordered(&sch, a, b), "steps {a}, {b}");
            }
        }
        (slot_of, sch)
    }

    /// Every pair of steps that touch one buffer, one of them writing it, runs in plan order.
    fn assert_hazard_free(plan: &Plan, slot_of: &[usize], sch: &Schedule) {
        let touches = |s: usize| -> (Vec<usize>, usize) {
            let st = &plan.steps[s];
            (
                st.inputs().iter().map(|&t| slot_of[t]).collect(),
                slot_of[st.output()],
            )
        };
        for b in 0..plan.steps.len() {
            let (b_in, b_out) = touches(b);
            for a in 0..b {
                let (a_in, a_out) = touches(a);
                let conflict = a_out == b_out || b_in.contains(&a_out) || a_in.contains(&b_out);
                if conflict {
                    assert!(
                        ordered(sch, a, b),
                        "steps {} and {} share a buffer but may run at once",
                        plan.steps[a].name(),
                        plan.steps[b].name()
                    );
                }
            }
        }
    }

    #[test]
    fn a_downsampling_shortcut_runs_beside_the_main_branch() {
        let plan = plan_of(&downsampling_block(), [2, 3, 16, 16], Precision::Fp32);
        let all = vec![true; plan.steps.len()];
        let (slot_of, sch) = scheduled(&plan, &all, 2);
        let (c1, c2) = (
            step_named(&plan, "block.conv1"),
            step_named(&plan, "block.conv3"),
        );
        // The add and ReLU fold into one of the two convs; the other runs on its own.
        let convs: Vec<usize> = plan
            .steps
            .iter()
            .enumerate()
            .filter(|(_, s)| matches!(s, Step::Conv(c) if c.residual.is_some()))
            .map(|(i, _)| i)
            .collect();
        assert_eq!(convs.len(), 1, "one conv takes the residual");
        let join = convs[0];
        let side = [c2, step_named(&plan, "block.shortcut")]
            .into_iter()
            .find(|&s| s != join)
            .expect("the other branch");
        assert_eq!(sch.stream[c1], 0);
        assert_ne!(sch.stream[side], sch.stream[c1], "{:?}", sch);
        assert_eq!(sch.stream[join], 0);
        assert!(sch.waits[join].contains(&side));
        for main in [c1, step_named(&plan, "block.conv2")] {
            assert!(
                !ordered(&sch, main, side),
                "the branch waits for {main}: {sch:?}"
            );
        }
        assert_eq!(sch.streams, 2);
        assert_hazard_free(&plan, &slot_of, &sch);
        // Buffers shared as on one stream: the shortcut would overwrite conv1's output while
        // conv2 reads it, so the hazard waits order it after conv2.
        let (one_stream, _) = assign_buffers(&plan, |_, _| true);
        let sch = schedule(&plan, &one_stream, &all, 2);
        assert_hazard_free(&plan, &one_stream, &sch);
        assert!(
            ordered(&sch, step_named(&plan, "block.conv2"), side),
            "{sch:?}"
        );
        // Steps that must stay on the main stream do, and the schedule stays safe.
        let mut pinned = all.clone();
        pinned[side] = false;
        let (_, sch) = scheduled(&plan, &pinned, 2);
        assert_eq!(sch.streams, 1);
        assert!(sch.waits.iter().all(|w| w.is_empty()));
    }

    #[test]
    fn parallel_branches_take_separate_streams_and_buffer_reuse_stays_ordered() {
        let plan = plan_of(&three_branches(), [2, 3, 16, 16], Precision::Fp32);
        let all = vec![true; plan.steps.len()];
        let (slot_of, sch) = scheduled(&plan, &all, 3);
        let lanes: Vec<usize> = ["a", "b", "c"]
            .iter()
            .map(|n| sch.stream[step_named(&plan, n)])
            .collect();
        assert_eq!(lanes, vec![0, 1, 2], "{sch:?}");
        assert_hazard_free(&plan, &slot_of, &sch);
        // With one auxiliary stream the third branch queues behind the second.
        let (slot_of, sch) = scheduled(&plan, &all, 1);
        assert_eq!(sch.streams, 2);
        assert_hazard_free(&plan, &slot_of, &sch);
        // A chain has nothing to run beside it.
        let plan = plan_of(&residual_classifier(5), [1, 3, 16, 16], Precision::Fp32);
        let (slot_of, sch) = scheduled(&plan, &vec![true; plan.steps.len()], 3);
        assert_eq!(slot_of, assign_buffers(&plan, |_, _| true).0);
        assert_eq!(sch.streams, 1, "{sch:?}");
        assert_hazard_free(&plan, &slot_of, &sch);
    }
}
