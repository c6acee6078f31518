;; pre_filter: the rolling-mill line's pre-processing, between the constraint gate and the model.
;; Per signal i (n = header.n_in = header.n_out):
;;   u[i] = scale[i] * x[i] + offset[i]                  unit conversion / scaling
;;   y[i] = y[i] + alpha[i] * (u[i] - y[i])              first-order low-pass (alpha = 1: no filter)
;; The first call, and the first call after the host sets header.reset, starts the filter at u.
;; A NaN or infinite u (or y) leaves the state as it was and outputs NaN (the host refuses a non-finite output:
;; fail-safe command); a pending reset then waits for a call whose values are all finite.
;; Layout and exports: ABI.md. Parameters: scale at PARAMS+0, offset at PARAMS+512, alpha at PARAMS+1024
;; (64 f64 each).
(module
  (memory (export "memory") 1)
  (global $version i32 (i32.const 1))

  ;; header: abi 1, n_in 6, n_out 6, reset 1 (start the filter at the first input)
  (data (i32.const 0x000) "\01\00\00\00" "\06\00\00\00" "\06\00\00\00" "\01\00\00\00")
  ;; scale[0..5] = 1.0: the demo PLC publishes in the model's units (mm, kN, m/s)
  (data (i32.const 0x100)
    "\00\00\00\00\00\00\f0\3f" "\00\00\00\00\00\00\f0\3f" "\00\00\00\00\00\00\f0\3f"
    "\00\00\00\00\00\00\f0\3f" "\00\00\00\00\00\00\f0\3f" "\00\00\00\00\00\00\f0\3f")
  ;; offset[0..5] = 0.0 (zeroed memory)
  ;; alpha: thicknesses and gap unfiltered (1.0), force and tension 0.5, speed 0.5
  (data (i32.const 0x500)
    "\00\00\00\00\00\00\f0\3f" "\00\00\00\00\00\00\f0\3f" "\00\00\00\00\00\00\f0\3f"
    "\00\00\00\00\00\00\e0\3f" "\00\00\00\00\00\00\e0\3f" "\00\00\00\00\00\00\e0\3f")

  (func (export "version") (result i32) (global.get $version))

  ;; 0 = parameters usable; 1 wrong ABI, 2 n_in != n_out, 3 n outside 1..64, 4 alpha outside (0, 1],
  ;; 5 a scale or offset that is not finite
  (func (export "selftest") (result i32)
    (local $n i32) (local $i i32) (local $a f64) (local $v f64)
    (if (i32.ne (i32.load (i32.const 0x000)) (i32.const 1)) (then (return (i32.const 1))))
    (local.set $n (i32.load (i32.const 0x004)))
    (if (i32.ne (local.get $n) (i32.load (i32.const 0x008))) (then (return (i32.const 2))))
    (if (i32.or (i32.lt_s (local.get $n) (i32.const 1)) (i32.gt_s (local.get $n) (i32.const 64)))
      (then (return (i32.const 3))))
    (block $done
      (loop $next
        (br_if $done (i32.ge_s (local.get $i) (local.get $n)))
        (local.set $a (f64.load offset=0x500 (i32.shl (local.get $i) (i32.const 3))))
        ;; written so that NaN fails too
        (if (i32.eqz (i32.and (f64.gt (local.get $a) (f64.const 0)) (f64.le (local.get $a) (f64.const 1))))
          (then (return (i32.const 4))))
        (local.set $v (f64.add (f64.load offset=0x100 (i32.shl (local.get $i) (i32.const 3)))
                               (f64.load offset=0x300 (i32.shl (local.get $i) (i32.const 3)))))
        (if (f64.ne (f64.sub (local.get $v) (local.get $v)) (f64.const 0)) (then (return (i32.const 5))))
        (local.set $i (i32.add (local.get $i) (i32.const 1)))
        (br $next)))
    (i32.const 0))

  ;; 1 when v is neither NaN nor infinite (v - v is 0 exactly then)
  (func $finite (param $v f64) (result i32)
    (f64.eq (f64.sub (local.get $v) (local.get $v)) (f64.const 0)))

  ;; inputs at 0x900, outputs at 0xB00, filter state y at 0x1000; returns 0
  (func (export "process") (result i32)
    (local $n i32) (local $i i32) (local $o i32) (local $reset i32) (local $bad i32) (local $u f64) (local $y f64)
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
            (local.set $y (f64.add (local.get $y)
                                   (f64.mul (f64.load offset=0x500 (local.get $o))
                                            (f64.sub (local.get $u) (local.get $y)))))))
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
