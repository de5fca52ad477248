//! Resize: nearest, linear and cubic, by scales and by sizes.

use super::*;

/// What a Resize case resizes to.
#[derive(Clone, Copy)]
enum Target {
    Scales([f32; 4]),
    Sizes([i64; 4]),
}

pub(super) fn resize_modes_cases() -> Vec<Case> {
    let s = [1, 4, 6, 8];
    let mut cases = vec![];
    let coords = [
        "half_pixel",
        "asymmetric",
        "align_corners",
        "pytorch_half_pixel",
    ];
    // Up by 2, down by 2 (scales), and to 9 x 12 (sizes: a scale of 1.5).
    let targets = [
        ("x2", Target::Scales([1.0, 1.0, 2.0, 2.0])),
        ("x0.5", Target::Scales([1.0, 1.0, 0.5, 0.5])),
        ("to 9x12", Target::Sizes([1, 4, 9, 12])),
    ];
    let add = |cases: &mut Vec<Case>, name: String, attrs: Vec<AttributeProto>, t: Target| {
        cases.push(graph(&name, &s, 13, move |b, x| {
            let roi = b.constant("roi", &[0], &[]);
            let ins: Vec<String> = match t {
                Target::Scales(sc) => vec![roi, b.constant("scales", &[4], &sc)],
                Target::Sizes(sz) => {
                    let empty = b.constant("no_scales", &[0], &[]);
                    vec![roi, empty, b.ints("sizes", &[4], &sz)]
                }
            };
            let mut refs: Vec<&str> = vec![x];
            refs.extend(ins.iter().map(|s| s.as_str()));
            b.node("Resize", "rs", &refs, attrs)
        }));
    };
    for (what, t) in targets {
        for coord in coords {
            for mode in ["linear", "cubic"] {
                add(
                    &mut cases,
                    format!("Resize {mode} {coord} {what}"),
                    vec![
                        string("mode", mode),
                        string("coordinate_transformation_mode", coord),
                    ],
                    t,
                );
            }
        }
        for (coord, nearest) in [
            ("asymmetric", "floor"),
            ("half_pixel", "round_prefer_floor"),
            ("half_pixel", "round_prefer_ceil"),
            ("align_corners", "round_prefer_floor"),
            ("pytorch_half_pixel", "ceil"),
        ] {
            add(
                &mut cases,
                format!("Resize nearest {coord} {nearest} {what}"),
                vec![
                    string("mode", "nearest"),
                    string("coordinate_transformation_mode", coord),
                    string("nearest_mode", nearest),
                ],
                t,
            );
        }
        // Cubic as PyTorch (a = -0.75) and as TensorFlow (a = -0.5, exclude_outside).
        add(
            &mut cases,
            format!("Resize cubic a -0.5 exclude_outside {what}"),
            vec![
                string("mode", "cubic"),
                float_attr("cubic_coeff_a", -0.5),
                int("exclude_outside", 1),
            ],
            t,
        );
    }
    cases.push(graph("Resize linear after conv", &s, 13, |b, x| {
        let c = after_conv(b, x, 4);
        let roi = b.constant("roi", &[0], &[]);
        let sc = b.constant("scales", &[4], &[1.0, 1.0, 2.0, 2.0]);
        b.node(
            "Resize",
            "rs",
            &[&c, &roi, &sc],
            vec![string("mode", "linear")],
        )
    }));
    cases
}
