//! Writes the compile bomb the tests use (`bomb::default_bomb`, or `DEPTH LOCALS` from
//! the arguments) to stdout, to measure it: `compile-bomb > bomb.wasm`.

use std::io::Write as _;

fn main() {
    let args: Vec<usize> = std::env::args()
        .skip(1)
        .map(|a| a.parse().expect("DEPTH LOCALS are numbers"))
        .collect();
    let bytes = match args[..] {
        [depth, locals] => wasm_provisioner_tests::bomb::compile_bomb(depth, locals),
        _ => wasm_provisioner_tests::bomb::default_bomb(),
    };
    std::io::stdout().write_all(&bytes).expect("stdout");
}
