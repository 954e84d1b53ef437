//! One module per report mode: what it asks of the kernel and how it folds records into its
//! profile type.
pub mod hotspot;
pub mod lock;
pub mod sched;
pub mod topdown;
