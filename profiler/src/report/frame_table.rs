//! The frames table of the JSON reports (since format_version 2): each distinct frame once, in
//! a top-level `frames` array, and every stack a list of indices into it. Written here for the
//! JSON renderer, and read back here for whatever reads our JSON.
use std::collections::HashMap;

use serde_json::Value;

use crate::symbolize::Frame;

/// The distinct frames of one report, in the order they were first met.
#[derive(Default)]
pub(crate) struct FrameTable<'a> {
    index: HashMap<&'a Frame, usize>,
    frames: Vec<&'a Frame>,
}

impl<'a> FrameTable<'a> {
    /// A stack as indices into the table, adding the frames it does not hold yet.
    pub fn ids(&mut self, stack: &'a [Frame]) -> Vec<usize> {
        stack
            .iter()
            .map(|frame| {
                *self.index.entry(frame).or_insert_with(|| {
                    self.frames.push(frame);
                    self.frames.len() - 1
                })
            })
            .collect()
    }

    pub fn into_frames(self) -> Vec<&'a Frame> {
        self.frames
    }
}

/// A JSON report as read, with each stack's frame indices (format_version 2) replaced by the
/// frames of the top-level table they name, so that it reads as version 1 did: every stack a
/// list of frame objects. A version 1 report is left as it is.
pub fn inline_frames(doc: &mut Value) -> Result<(), String> {
    let Some(Value::Array(table)) = doc.as_object_mut().and_then(|d| d.remove("frames")) else {
        return Ok(());
    };
    inline_in(doc, &table)
}

fn inline_in(value: &mut Value, table: &[Value]) -> Result<(), String> {
    match value {
        Value::Object(map) => {
            for (key, inner) in map.iter_mut() {
                match (key.as_str(), inner) {
                    ("frames", Value::Array(stack)) => {
                        for frame in stack.iter_mut().filter(|f| !f.is_object()) {
                            *frame = table_entry(frame, table)?;
                        }
                    }
                    (_, inner) => inline_in(inner, table)?,
                }
            }
            Ok(())
        }
        Value::Array(items) => items.iter_mut().try_for_each(|item| inline_in(item, table)),
        _ => Ok(()),
    }
}

fn table_entry(id: &Value, table: &[Value]) -> Result<Value, String> {
    id.as_u64()
        .and_then(|i| table.get(usize::try_from(i).ok()?))
        .cloned()
        .ok_or_else(|| {
            format!(
                "a stack names frame {id}, which the frames table of {} entries does not hold",
                table.len()
            )
        })
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::model::tests::frame;

    #[test]
    fn each_distinct_frame_is_in_the_table_once() {
        let (main, run, leaf) = (frame("main"), frame("run"), frame("leaf"));
        let mut other_leaf = frame("leaf");
        other_leaf.address += 4;
        let stacks = [
            vec![main.clone(), run.clone(), leaf.clone()],
            vec![main.clone(), run.clone(), other_leaf.clone()],
            vec![main.clone(), leaf.clone()],
        ];
        let mut table = FrameTable::default();
        let ids: Vec<Vec<usize>> = stacks.iter().map(|s| table.ids(s)).collect();
        assert_eq!(ids, [vec![0, 1, 2], vec![0, 1, 3], vec![0, 2]]);
        let frames = table.into_frames();
        assert_eq!(frames, [&main, &run, &leaf, &other_leaf]);
        for (stack, ids) in stacks.iter().zip(&ids) {
            let named: Vec<&Frame> = ids.iter().map(|&i| frames[i]).collect();
            assert_eq!(named, stack.iter().collect::<Vec<_>>());
        }
    }

    #[test]
    fn indices_read_back_as_the_frames_they_name() {
        let mut doc = json!({
            "format_version": 2,
            "stacks": [{"count": 3, "frames": [0, 1]}, {"count": 1, "frames": [1]}],
            "locks": [{"waiters": [{"frames": [1, 0]}], "holders": []}],
            "frames": [{"function": "main"}, {"function": "leaf"}]
        });
        inline_frames(&mut doc).unwrap();
        assert_eq!(
            doc,
            json!({
                "format_version": 2,
                "stacks": [{"count": 3, "frames": [{"function": "main"}, {"function": "leaf"}]},
                           {"count": 1, "frames": [{"function": "leaf"}]}],
                "locks": [{"waiters": [{"frames": [{"function": "leaf"}, {"function": "main"}]}], "holders": []}]
            })
        );
    }

    #[test]
    fn saved_profiles_of_either_version_read_back_the_same() {
        let mut v2 = Vec::new();
        let report = crate::report::tests::sample_report();
        crate::report::renderer(crate::cli::Format::Json)
            .hotspot(&report, &mut v2)
            .unwrap();
        let mut v1: Value = serde_json::from_slice(&v2).unwrap();
        assert!(v1["stacks"][0]["frames"][0].is_u64(), "written as version 2");
        inline_frames(&mut v1).unwrap();
        v1["format_version"] = json!(1);
        let read = |bytes: &[u8]| crate::views::saved::parse(bytes, "saved").unwrap().stacks;
        let (from_v1, from_v2) = (read(&serde_json::to_vec(&v1).unwrap()), read(&v2));
        let frames = |stacks: &[crate::model::Stack]| -> Vec<Vec<Frame>> {
            stacks.iter().map(|s| s.frames.clone()).collect()
        };
        assert_eq!(frames(&from_v2), frames(&report.stacks));
        assert_eq!(frames(&from_v1), frames(&from_v2));
    }

    #[test]
    fn version_1_reads_as_it_is_and_bad_indices_are_refused() {
        let v1 = json!({"format_version": 1, "stacks": [{"count": 1, "frames": [{"function": "main"}]}]});
        let mut doc = v1.clone();
        inline_frames(&mut doc).unwrap();
        assert_eq!(doc, v1);
        for bad in [json!(2), json!(-1), json!("0"), json!(null)] {
            let mut doc = json!({"stacks": [{"frames": [0, bad]}], "frames": [{"function": "main"}, {}]});
            let error = inline_frames(&mut doc).unwrap_err();
            assert!(error.contains("frames table of 2 entries"), "{error}");
        }
    }
}
