;; post_command: maps the model's output to the PLC command, between the model and the safety envelope.
;; Per output i (n = header.n_in = header.n_out):
;;   u[i] = gain[i] * x[i] + offset[i]                   model units -> command units
;;   y[i] = y[i] + clamp(u[i] - y[i], -max_step[i], max_step[i])   rate shaping per frame
;; The first call, and the first call after the host sets header.reset, starts at u (no shaping).
;; A NaN or infinite u (or y) leaves the state as it was and outputs NaN (the host refuses a non-finite output:
;; fail-safe command); a pending reset then waits for a call whose values are all finite.
;; The safety envelope after this module still enforces the actuator limits and rates.
;; Layout and exports: ABI.md. Parameters: gain at PARAMS+0, offset at PARAMS+512, max_step at PARAMS+1024.
(module
  (memory (export "memory") 1)
  (global $version i32 (i32.const 1))

  ;; header: abi 1, n_in 1, n_out 1, reset 1
  (data (i32.const 0x000) "\01\00\00\00" "\01\00\00\00" "\01\00\00\00" "\01\00\00\00")
  ;; gain[0] = 1.0: the model predicts the roll-gap correction in mm, the PLC takes mm
  (data (i32.const 0x100) "\00\00\00\00\00\00\f0\3f")
  ;; offset[0] = 0.0; max_step[0] = 0.05 mm per frame (5 mm/s at 100 Hz; the envelope allows 2 mm/s)
  (data (i32.const 0x500) "\9a\99\99\99\99\99\a9\3f")

  (func (export "version") (result i32) (global.get $version))

  ;; 0 = parameters usable; 1 wrong ABI, 2 n_in != n_out, 3 n outside 1..64, 4 max_step not > 0,
  ;; 5 a gain or offset that is not finite
  (func (export "selftest") (result i32)
    (local $n i32) (local $i i32) (local $s f64) (local $v f64)
    (if (i32.ne (i32.load (i32.const 0x000)) (i32.const 1)) (then (return (i32.const 1))))
    (local.set $n (i32.load (i32.const 0x004)))
    (if (i32.ne (local.get $n) (i32.load (i32.const 0x008))) (then (return (i32.const 2))))
    (if (i32.or (i32.lt_s (local.get $n) (i32.const 1)) (i32.gt_s (local.get $n) (i32.const 64)))
      (then (return (i32.const 3))))
    (block $done
      (loop $next
        (br_if $done (i32.ge_s (local.get $i) (local.get $n)))
        (local.set $s (f64.load offset=0x500 (i32.shl (local.get $i) (i32.const 3))))
        (if (i32.eqz (f64.gt (local.get $s) (f64.const 0))) (then (return (i32.const 4))))
        (local.set $v (f64.add (f64.load offset=0x100 (i32.shl (local.get $i) (i32.const 3)))
                               (f64.load offset=0x300 (i32.shl (local.get $i) (i32.const 3)))))
        (if (f64.ne (f64.sub (local.get $v) (local.get $v)) (f64.const 0)) (then (return (i32.const 5))))
        (local.set $i (i32.add (local.get $i) (i32.const 1)))
        (br $next)))
    (i32.const 0))

  ;; 1 when v is neither NaN nor infinite (v - v is 0 exactly then)
  (func $finite (param $v f64) (result i32)
    (f64.eq (f64.sub (local.get $v) (local.get $v)) (f64.const 0)))

  (func (export "process") (result i32)
    (local $n i32) (local $i i32) (local $o i32) (local $reset i32) (local $bad i32) (local $u f64) (local $y f64)
    (local $s f64)
    (local.set $n (i32.load (i32.const 0x004)))
    (local.set $reset (i32.load (i32.const 0x00C)))
    (block $done
      (loop $next
        (br_if $done (i32.ge_s (local.get $i) (local.get $n)))
        (local.set $o (i32.shl (local.get $i) (i32.const 3)))
        (local.set $u (f64.add (f64.mul (f64.load offset=0x100 (local.get $o)) (f64.load offset=0x900 (local.get $o)))
                               (f64.load offset=0x300 (local.get $o))))
        (if (local.get $reset)
          (then (local.set $y (local.get $u)))
          (else
            (local.set $y (f64.load offset=0x1000 (local.get $o)))
            (local.set $s (f64.load offset=0x500 (local.get $o)))
            (local.set $y (f64.add (local.get $y)
                                   (f64.min (local.get $s) (f64.max (f64.neg (local.get $s))
                                                                    (f64.sub (local.get $u) (local.get $y))))))))
        (if (i32.and (call $finite (local.get $u)) (call $finite (local.get $y)))
          (then (f64.store offset=0x1000 (local.get $o) (local.get $y)))
          (else  ;; the state keeps its last value; the output tells the host
            (local.set $bad (i32.const 1))
            (local.set $y (f64.const nan))))
        (f64.store offset=0xB00 (local.get $o) (local.get $y))
        (local.set $i (i32.add (local.get $i) (i32.const 1)))
        (br $next)))
    (i32.store (i32.const 0x00C) (i32.and (local.get $reset) (local.get $bad)))
    (i32.const 0))
)
