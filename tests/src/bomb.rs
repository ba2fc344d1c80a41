//! A compile bomb: a small component whose one unused core function (thousands of
//! nested blocks, a `br_table` to every one of them, a thousand locals changed between
//! the blocks) takes Cranelift a long time and a lot of memory to compile, growing
//! faster than its size. Written as WAT text here, never checked in as a blob. It need
//! not implement the plugin world: wasmtime compiles every core module of a component
//! when it compiles the component, before anything is linked.

/// The bomb as a component: `depth` nested blocks, `locals` locals.
pub fn compile_bomb(depth: usize, locals: usize) -> Vec<u8> {
    let mut body = String::new();
    body.push_str("(component (core module (func (param i32)");
    for _ in 0..locals {
        body.push_str(" (local i32)");
    }
    for _ in 0..depth {
        body.push_str(" (block");
    }
    body.push_str(" local.get 0 br_table");
    for target in 0..depth {
        body.push_str(&format!(" {target}"));
    }
    // Between the blocks' ends, each level reads two locals and writes a third, so
    // every block's end is a merge (the `br_table` edge and the fall-through) of
    // different values of many locals, each looked up through every enclosing merge.
    let locals = locals.max(1);
    for level in 0..depth {
        body.push(')');
        let (a, b, c) = (
            1 + level * 7 % locals,
            1 + level * 13 % locals,
            1 + level % locals,
        );
        body.push_str(&format!(
            " local.get {a} local.get {b} i32.add local.set {c}"
        ));
    }
    body.push_str(")))");
    wat::parse_str(&body).expect("the bomb is valid WAT")
}

/// The bomb the tests use: about 200 KB, minutes and more than a GiB to compile
/// unbounded in a debug build.
pub fn default_bomb() -> Vec<u8> {
    compile_bomb(DEFAULT_DEPTH, DEFAULT_LOCALS)
}

pub const DEFAULT_DEPTH: usize = 3_000;
pub const DEFAULT_LOCALS: usize = 1_000;

#[cfg(test)]
mod tests {
    #[test]
    fn the_bomb_is_a_small_valid_component() {
        let bomb = super::compile_bomb(100, 10);
        assert!(bomb.starts_with(b"\0asm"));
        assert!(bomb.len() < 10_000, "{} bytes", bomb.len());
    }
}
