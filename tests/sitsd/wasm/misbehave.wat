;; Test module: identity on 6 values (a valid `pre` module for examples/rolling-mill.yaml) that
;; misbehaves on a trigger in input[0] (entry_thickness, binary-exact values inside its range):
;;   4.4375 -> endless loop (stopped by the epoch deadline or by fuel)
;;   4.3125 -> grows memory one page at a time until refused, then touches the page it asked for
;;   4.1875 -> unreachable
(module
  (memory (export "memory") 1)
  (data (i32.const 0x000) "\01\00\00\00" "\06\00\00\00" "\06\00\00\00" "\00\00\00\00")
  (func (export "version") (result i32) (i32.const 1))
  (func (export "selftest") (result i32) (i32.const 0))
  (func (export "process") (result i32)
    (local $i i32) (local $x f64) (local $pages i32)
    (local.set $x (f64.load (i32.const 0x900)))
    (if (f64.eq (local.get $x) (f64.const 4.4375))
      (then (loop $spin (br $spin))))
    (if (f64.eq (local.get $x) (f64.const 4.3125))
      (then
        (loop $grow
          (local.set $pages (memory.grow (i32.const 1)))
          (br_if $grow (i32.ne (local.get $pages) (i32.const -1))))
        ;; refused: write into the page that was not granted (out of bounds -> trap)
        (i32.store (i32.mul (memory.size) (i32.const 65536)) (i32.const 1))))
    (if (f64.eq (local.get $x) (f64.const 4.1875))
      (then unreachable))
    (block $done
      (loop $next
        (br_if $done (i32.ge_s (local.get $i) (i32.const 48)))
        (f64.store offset=0xB00 (local.get $i) (f64.load offset=0x900 (local.get $i)))
        (local.set $i (i32.add (local.get $i) (i32.const 8)))
        (br $next)))
    (i32.const 0))
)
