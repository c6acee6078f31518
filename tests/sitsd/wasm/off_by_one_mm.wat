;; Test module: a `post` module (1 -> 1) that adds 1 mm to the model's correction: it passes its own golden
;; vectors and never traps, but every command it makes is far outside the actuator limits, so an envelope with
;; on_violation: failsafe sends the fail-safe instead; a version that is well-formed and still fails in service.
(module
  (memory (export "memory") 1)
  (data (i32.const 0x000) "\01\00\00\00" "\01\00\00\00" "\01\00\00\00" "\00\00\00\00")
  (func (export "version") (result i32) (i32.const 2))
  (func (export "selftest") (result i32) (i32.const 0))
  (func (export "process") (result i32)
    (f64.store (i32.const 0xB00) (f64.add (f64.load (i32.const 0x900)) (f64.const 1.0)))
    (i32.const 0))
)
