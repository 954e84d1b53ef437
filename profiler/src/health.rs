//! What was recorded, lost and damaged, for every report to say: one [`Health`] field per row
//! of `profiler_common::health_table!`, the one declaration of each counter. From that table
//! come the fields (and their JSON), the kernel's reading, a window's share of a long run, the
//! warnings, the agent's `/metrics` lines ([`COUNTERS`]) and the check of docs/json.md.
use profiler_common::HealthCounter;
use serde::{Deserialize, Serialize};

use crate::sources::kind::Kind;

/// One counter's declaration, as user space reads it.
#[derive(Clone, Copy, Debug)]
pub struct Counter {
    /// Its field of `Health` (and of every JSON report's `health`).
    pub field: &'static str,
    /// Its slot in the kernel's `HEALTH` array; none where user space counts it.
    pub kernel: Option<HealthCounter>,
    /// The source whose records it speaks of; none for what every source shares (process
    /// tracking, stack walks).
    pub source: Option<Kind>,
    /// Its `/metrics` line (without the agent's prefix): a name two counters share is their sum.
    pub metric: &'static str,
    pub help: &'static str,
}

/// `samples`, `sched`, `locks`, `syscalls`, `latency` or `common`: the source a table row speaks of.
macro_rules! source_of {
    (samples) => {
        Some(Kind::CpuSamples)
    };
    (sched) => {
        Some(Kind::Sched)
    };
    (locks) => {
        Some(Kind::Locks)
    };
    (syscalls) => {
        Some(Kind::Syscalls)
    };
    (latency) => {
        Some(Kind::Latency)
    };
    (common) => {
        None
    };
}

macro_rules! health_struct {
    (
        kernel { $($variant:ident = $slot:literal, $field:ident, $source:ident, $metric:literal, $help:literal, $warn:expr;)* }
        user { $($user:ident, $usource:ident, $umetric:literal, $uhelp:literal, $uwarn:expr;)* }
    ) => {
        /// Health of a run (or of a window of one): everything recorded, lost or damaged.
        #[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
        #[serde(default)]
        pub struct Health {
            $(#[doc = $help] pub $field: u64,)*
            $(#[doc = $uhelp] pub $user: u64,)*
            /// Each file counted in `files_without_tables`, as "path: reason".
            #[serde(skip_serializing_if = "Vec::is_empty")]
            pub files_without_tables_named: Vec<String>,
        }

        /// Every counter, in the table's order.
        pub const COUNTERS: &[Counter] = &[
            $(Counter {
                field: stringify!($field),
                kernel: Some(HealthCounter::$variant),
                source: source_of!($source),
                metric: $metric,
                help: $help,
            },)*
            $(Counter {
                field: stringify!($user),
                kernel: None,
                source: source_of!($usource),
                metric: $umetric,
                help: $uhelp,
            },)*
        ];

        impl Health {
            /// The kernel's counters, each read by `read` (user space's are left at 0).
            pub fn from_kernel(read: impl Fn(HealthCounter) -> anyhow::Result<u64>) -> anyhow::Result<Health> {
                Ok(Health {
                    $($field: read(HealthCounter::$variant)?,)*
                    ..Health::default()
                })
            }

            /// Each counter's value, in the table's order (`COUNTERS`).
            pub fn values(&self) -> Vec<u64> {
                vec![$(self.$field,)* $(self.$user,)*]
            }

            /// A window's share of a long run: what the kernel's counters (cumulative) grew by
            /// since `earlier`; user space's are the window's own, set by whoever keeps it.
            pub fn since(&self, earlier: &Health) -> Health {
                Health {
                    $($field: self.$field.saturating_sub(earlier.$field),)*
                    ..Health::default()
                }
            }

            /// Only the counters of these sources and those every source shares (the others 0):
            /// what one of the agent's profiles speaks of.
            pub fn of(&self, kinds: &[Kind]) -> Health {
                let keep = |source: Option<Kind>| source.is_none_or(|s| kinds.contains(&s));
                Health {
                    $($field: if keep(source_of!($source)) { self.$field } else { 0 },)*
                    $($user: if keep(source_of!($usource)) { self.$user } else { 0 },)*
                    files_without_tables_named: match keep(None) {
                        true => self.files_without_tables_named.clone(),
                        false => Vec::new(),
                    },
                }
            }

            /// Sentences for the top of a report, one per problem; empty when all is well.
            pub fn warnings(&self) -> Vec<String> {
                let warnings: &[fn(&Health) -> Option<String>] = &[$($warn,)* $($uwarn,)*];
                warnings.iter().filter_map(|warn| warn(self)).collect()
            }
        }
    };
}

profiler_common::health_table!(health_struct);

impl Health {
    pub fn lost(&self) -> u64 {
        self.lost_map_full
    }

    pub fn collisions(&self) -> u64 {
        self.user_stack_collisions + self.kernel_stack_collisions
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::*;

    /// The field names docs/json.md's Health table lists.
    fn documented() -> BTreeSet<String> {
        let page = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/json.md")).unwrap();
        let section = page
            .split("\n## ")
            .find(|s| s.starts_with("Health"))
            .expect("docs/json.md has a Health section");
        section
            .lines()
            .filter(|l| l.starts_with("| `"))
            .flat_map(|l| l.split('|').nth(1).unwrap_or("").split(','))
            .map(|name| name.trim().trim_matches('`').to_string())
            .collect()
    }

    #[test]
    fn every_counter_is_documented_and_every_documented_field_is_a_counter() {
        let mut fields: BTreeSet<String> = COUNTERS.iter().map(|c| c.field.to_string()).collect();
        fields.insert("files_without_tables_named".into());
        assert_eq!(
            documented(),
            fields,
            "docs/json.md's Health table and the counters"
        );
        // And the JSON has exactly those fields.
        let json = serde_json::to_value(Health {
            files_without_tables_named: vec!["x".into()],
            ..Health::default()
        })
        .unwrap();
        let keys: BTreeSet<String> = json.as_object().unwrap().keys().cloned().collect();
        assert_eq!(keys, fields);
    }

    #[test]
    fn every_kernel_slot_is_read_once_into_its_own_field() {
        let slots: Vec<u32> = COUNTERS
            .iter()
            .filter_map(|c| c.kernel.map(|k| k as u32))
            .collect();
        assert_eq!(slots, (0..profiler_common::HEALTH_COUNTERS).collect::<Vec<_>>());
        // Each slot's value lands in its own field: read slot n as n + 1.
        let health = Health::from_kernel(|c| Ok(c as u64 + 1)).unwrap();
        for (counter, value) in COUNTERS.iter().zip(health.values()) {
            let expected = counter.kernel.map_or(0, |k| k as u64 + 1);
            assert_eq!(value, expected, "{}", counter.field);
        }
    }

    #[test]
    fn a_window_holds_what_the_kernel_counted_since_the_last() {
        let earlier = Health::from_kernel(|c| Ok(10 * c as u64)).unwrap();
        let now = Health::from_kernel(|c| Ok(10 * c as u64 + 3)).unwrap();
        let window = now.since(&earlier);
        assert!(COUNTERS
            .iter()
            .zip(window.values())
            .all(|(c, v)| v == if c.kernel.is_some() { 3 } else { 0 }));
        let lock = window.of(&[Kind::Locks]);
        assert_eq!(
            (lock.lock_map_full, lock.samples, lock.offcpu_map_full),
            (3, 0, 0)
        );
        assert_eq!(lock.unwind_walks, 3, "what every source shares stays");
    }

    #[test]
    fn warnings_say_each_problem_once_and_nothing_when_all_is_well() {
        let quiet = Health {
            samples: 1000,
            unwind_walks: 900,
            sched_switches: 50,
            ..Health::default()
        };
        assert!(quiet.warnings().is_empty(), "{:?}", quiet.warnings());
        let troubled = Health {
            samples: 990,
            lost_map_full: 10,
            kernel_stack_collisions: 2,
            build_id_map_full: 1,
            unwind_before_tables: 5,
            ..Health::default()
        };
        let warnings = troubled.warnings();
        println!("{warnings:#?}");
        assert_eq!(
            warnings.len(),
            3,
            "lost, collisions (both kinds, once), build id; 5 of 990 is no share worth saying"
        );
        assert!(warnings[0].starts_with("10 samples lost (1.0%)"));
        assert!(warnings[1].starts_with("2 stacks lost to stack-map collisions (0 user, 2 kernel"));
    }
}
