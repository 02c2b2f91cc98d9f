module @stablegraph {
  func.func public @main(%p0_x: tensor<2x3xf32>, %p1_idx: tensor<4xi32>, %p2_table: tensor<5x2xbf16>, %p3_long: tensor<20xi64>) -> (tensor<2xf32>, tensor<2x1xi64>, tensor<2x3xf32>, tensor<20xi64>, tensor<2x3xf32>, tensor<2x3xi64>, tensor<4x2xbf16>, tensor<2x4xf32>) {
    %v4_init = stablehlo.constant dense<0xFF800000> : tensor<f32>
    %v4 = "stablehlo.reduce"(%p0_x, %v4_init) ({
    ^bb0(%v4_a: tensor<f32>, %v4_b: tensor<f32>):
      %v4_maximum = stablehlo.maximum %v4_a, %v4_b : tensor<f32>
      %v4_a_nan = stablehlo.compare NE, %v4_a, %v4_a, FLOAT : (tensor<f32>, tensor<f32>) -> tensor<i1>
      %v4_or_a = stablehlo.select %v4_a_nan, %v4_a, %v4_maximum : tensor<i1>, tensor<f32>
      %v4_b_nan = stablehlo.compare NE, %v4_b, %v4_b, FLOAT : (tensor<f32>, tensor<f32>) -> tensor<i1>
      %v4_r = stablehlo.select %v4_b_nan, %v4_b, %v4_or_a : tensor<i1>, tensor<f32>
      stablehlo.return %v4_r : tensor<f32>
    }) {dimensions = array<i64: 1>} : (tensor<2x3xf32>, tensor<f32>) -> tensor<2xf32>
    %v5_isnan = stablehlo.compare NE, %p0_x, %p0_x, FLOAT : (tensor<2x3xf32>, tensor<2x3xf32>) -> tensor<2x3xi1>
    %v5_worst = stablehlo.constant dense<0x7F800000> : tensor<2x3xf32>
    %v5_numbers = stablehlo.select %v5_isnan, %v5_worst, %p0_x : tensor<2x3xi1>, tensor<2x3xf32>
    %v5_init = stablehlo.constant dense<0x7F800000> : tensor<f32>
    %v5_best = stablehlo.reduce(%v5_numbers init: %v5_init) applies stablehlo.minimum across dimensions = [1] : (tensor<2x3xf32>, tensor<f32>) -> tensor<2xf32>
    %v5_bestb = stablehlo.broadcast_in_dim %v5_best, dims = [0] : (tensor<2xf32>) -> tensor<2x3xf32>
    %v5_hit = stablehlo.compare EQ, %p0_x, %v5_bestb, FLOAT : (tensor<2x3xf32>, tensor<2x3xf32>) -> tensor<2x3xi1>
    %v5_iota = stablehlo.iota dim = 1 : tensor<2x3xi32>
    %v5_none = stablehlo.constant dense<2147483647> : tensor<2x3xi32>
    %v5_len = stablehlo.constant dense<3> : tensor<2x3xi32>
    %v5_late = stablehlo.add %v5_iota, %v5_len : tensor<2x3xi32>
    %v5_numkey = stablehlo.select %v5_hit, %v5_iota, %v5_none : tensor<2x3xi1>, tensor<2x3xi32>
    %v5_keys = stablehlo.select %v5_isnan, %v5_late, %v5_numkey : tensor<2x3xi1>, tensor<2x3xi32>
    %v5_kinit = stablehlo.constant dense<2147483647> : tensor<i32>
    %v5_first = stablehlo.reduce(%v5_keys init: %v5_kinit) applies stablehlo.minimum across dimensions = [1] : (tensor<2x3xi32>, tensor<i32>) -> tensor<2xi32>
    %v5_olen = stablehlo.constant dense<3> : tensor<2xi32>
    %v5_late_one = stablehlo.compare GE, %v5_first, %v5_olen, SIGNED : (tensor<2xi32>, tensor<2xi32>) -> tensor<2xi1>
    %v5_early = stablehlo.subtract %v5_first, %v5_olen : tensor<2xi32>
    %v5_pos = stablehlo.select %v5_late_one, %v5_early, %v5_first : tensor<2xi1>, tensor<2xi32>
    %v5 = stablehlo.convert %v5_pos : (tensor<2xi32>) -> tensor<2xi64>
    %v6 = stablehlo.reshape %v5 : (tensor<2xi64>) -> tensor<2x1xi64>
    %v7 = stablehlo.constant dense<0.0> : tensor<f32>
    %v8 = stablehlo.pad %p0_x, %v7, low = [0, 1], high = [0, -1], interior = [0, 0] : (tensor<2x3xf32>, tensor<f32>) -> tensor<2x3xf32>
    %v9_init = stablehlo.constant dense<0.0> : tensor<f32>
    %v9 = "stablehlo.reduce_window"(%v8, %v9_init) ({
    ^bb0(%v9_a: tensor<f32>, %v9_b: tensor<f32>):
      %v9_sum = stablehlo.add %v9_a, %v9_b : tensor<f32>
      stablehlo.return %v9_sum : tensor<f32>
    }) {window_dimensions = array<i64: 1, 3>, padding = dense<[[0, 0], [2, 0]]> : tensor<2x2xi64>} : (tensor<2x3xf32>, tensor<f32>) -> tensor<2x3xf32>
    %v10 = stablehlo.reverse %p3_long, dims = [0] : tensor<20xi64>
    %v11_zero = stablehlo.constant dense<0> : tensor<i64>
    %v11_s0_kept = stablehlo.slice %v10 [0:19] : (tensor<20xi64>) -> tensor<19xi64>
    %v11_s0_shifted = stablehlo.pad %v11_s0_kept, %v11_zero, low = [1], high = [0], interior = [0] : (tensor<19xi64>, tensor<i64>) -> tensor<20xi64>
    %v11_s0 = stablehlo.add %v10, %v11_s0_shifted : tensor<20xi64>
    %v11_s1_kept = stablehlo.slice %v11_s0 [0:18] : (tensor<20xi64>) -> tensor<18xi64>
    %v11_s1_shifted = stablehlo.pad %v11_s1_kept, %v11_zero, low = [2], high = [0], interior = [0] : (tensor<18xi64>, tensor<i64>) -> tensor<20xi64>
    %v11_s1 = stablehlo.add %v11_s0, %v11_s1_shifted : tensor<20xi64>
    %v11_s2_kept = stablehlo.slice %v11_s1 [0:16] : (tensor<20xi64>) -> tensor<16xi64>
    %v11_s2_shifted = stablehlo.pad %v11_s2_kept, %v11_zero, low = [4], high = [0], interior = [0] : (tensor<16xi64>, tensor<i64>) -> tensor<20xi64>
    %v11_s2 = stablehlo.add %v11_s1, %v11_s2_shifted : tensor<20xi64>
    %v11_s3_kept = stablehlo.slice %v11_s2 [0:12] : (tensor<20xi64>) -> tensor<12xi64>
    %v11_s3_shifted = stablehlo.pad %v11_s3_kept, %v11_zero, low = [8], high = [0], interior = [0] : (tensor<12xi64>, tensor<i64>) -> tensor<20xi64>
    %v11_s3 = stablehlo.add %v11_s2, %v11_s3_shifted : tensor<20xi64>
    %v11_s4_kept = stablehlo.slice %v11_s3 [0:4] : (tensor<20xi64>) -> tensor<4xi64>
    %v11_s4_shifted = stablehlo.pad %v11_s4_kept, %v11_zero, low = [16], high = [0], interior = [0] : (tensor<4xi64>, tensor<i64>) -> tensor<20xi64>
    %v11 = stablehlo.add %v11_s3, %v11_s4_shifted : tensor<20xi64>
    %v12 = stablehlo.reverse %v11, dims = [0] : tensor<20xi64>
    %v13 = stablehlo.iota dim = 1 : tensor<2x3xi64>
    %v14:2 = "stablehlo.sort"(%p0_x, %v13) ({
    ^bb0(%v14_a: tensor<f32>, %v14_b: tensor<f32>, %v14_a1: tensor<i64>, %v14_b1: tensor<i64>):
      %v14_before = stablehlo.compare GT, %v14_a, %v14_b, FLOAT : (tensor<f32>, tensor<f32>) -> tensor<i1>
      %v14_a_nan = stablehlo.compare NE, %v14_a, %v14_a, FLOAT : (tensor<f32>, tensor<f32>) -> tensor<i1>
      %v14_b_nan = stablehlo.compare NE, %v14_b, %v14_b, FLOAT : (tensor<f32>, tensor<f32>) -> tensor<i1>
      %v14_number = stablehlo.not %v14_b_nan : tensor<i1>
      %v14_nan_order = stablehlo.and %v14_a_nan, %v14_number : tensor<i1>
      %v14_lt = stablehlo.or %v14_before, %v14_nan_order : tensor<i1>
      stablehlo.return %v14_lt : tensor<i1>
    }) {dimension = 1 : i64, is_stable = true} : (tensor<2x3xf32>, tensor<2x3xi64>) -> (tensor<2x3xf32>, tensor<2x3xi64>)
    %v15 = "stablehlo.gather"(%p2_table, %p1_idx) {dimension_numbers = #stablehlo.gather<offset_dims = [1], collapsed_slice_dims = [0], start_index_map = [0], index_vector_dim = 1>, slice_sizes = array<i64: 1, 2>, indices_are_sorted = false} : (tensor<5x2xbf16>, tensor<4xi32>) -> tensor<4x2xbf16>
    %v16 = stablehlo.constant dense<-1.0> : tensor<f32>
    %v17 = stablehlo.constant dense<1.0> : tensor<f32>
    %v18 = stablehlo.broadcast_in_dim %v16, dims = [] : (tensor<f32>) -> tensor<2x3xf32>
    %v19 = stablehlo.broadcast_in_dim %v17, dims = [] : (tensor<f32>) -> tensor<2x3xf32>
    %v20_lo_maximum = stablehlo.maximum %p0_x, %v18 : tensor<2x3xf32>
    %v20_lo_a_nan = stablehlo.compare NE, %p0_x, %p0_x, FLOAT : (tensor<2x3xf32>, tensor<2x3xf32>) -> tensor<2x3xi1>
    %v20_lo_or_a = stablehlo.select %v20_lo_a_nan, %p0_x, %v20_lo_maximum : tensor<2x3xi1>, tensor<2x3xf32>
    %v20_lo_b_nan = stablehlo.compare NE, %v18, %v18, FLOAT : (tensor<2x3xf32>, tensor<2x3xf32>) -> tensor<2x3xi1>
    %v20_lo = stablehlo.select %v20_lo_b_nan, %v18, %v20_lo_or_a : tensor<2x3xi1>, tensor<2x3xf32>
    %v20_minimum = stablehlo.minimum %v20_lo, %v19 : tensor<2x3xf32>
    %v20_a_nan = stablehlo.compare NE, %v20_lo, %v20_lo, FLOAT : (tensor<2x3xf32>, tensor<2x3xf32>) -> tensor<2x3xi1>
    %v20_or_a = stablehlo.select %v20_a_nan, %v20_lo, %v20_minimum : tensor<2x3xi1>, tensor<2x3xf32>
    %v20_b_nan = stablehlo.compare NE, %v19, %v19, FLOAT : (tensor<2x3xf32>, tensor<2x3xf32>) -> tensor<2x3xi1>
    %v20 = stablehlo.select %v20_b_nan, %v19, %v20_or_a : tensor<2x3xi1>, tensor<2x3xf32>
    %v21_maximum = stablehlo.maximum %v20, %v9 : tensor<2x3xf32>
    %v21_a_nan = stablehlo.compare NE, %v20, %v20, FLOAT : (tensor<2x3xf32>, tensor<2x3xf32>) -> tensor<2x3xi1>
    %v21_or_a = stablehlo.select %v21_a_nan, %v20, %v21_maximum : tensor<2x3xi1>, tensor<2x3xf32>
    %v21_b_nan = stablehlo.compare NE, %v9, %v9, FLOAT : (tensor<2x3xf32>, tensor<2x3xf32>) -> tensor<2x3xi1>
    %v21 = stablehlo.select %v21_b_nan, %v9, %v21_or_a : tensor<2x3xi1>, tensor<2x3xf32>
    %v22 = stablehlo.constant dense<0.0> : tensor<4x3xf32>
    %v23 = stablehlo.constant dense<0> : tensor<i64>
    %v24 = stablehlo.constant dense<4> : tensor<i64>
    %v46:5 = "stablehlo.while"(%v23, %v4, %v22, %v24, %p0_x) ({
    ^bb0(%v25: tensor<i64>, %v26: tensor<2xf32>, %v27: tensor<4x3xf32>, %v28: tensor<i64>, %v44: tensor<2x3xf32>):
      %v29 = stablehlo.compare LT, %v25, %v28, SIGNED : (tensor<i64>, tensor<i64>) -> tensor<i1>
      stablehlo.return %v29 : tensor<i1>
    }, {
    ^bb0(%v30: tensor<i64>, %v31: tensor<2xf32>, %v32: tensor<4x3xf32>, %v45: tensor<i64>, %v33: tensor<2x3xf32>):
      %v34_init = stablehlo.constant dense<0.0> : tensor<f32>
      %v34 = stablehlo.reduce(%v33 init: %v34_init) applies stablehlo.add across dimensions = [0] : (tensor<2x3xf32>, tensor<f32>) -> tensor<3xf32>
      %v35 = stablehlo.reshape %v34 : (tensor<3xf32>) -> tensor<1x3xf32>
      %v36_init = stablehlo.constant dense<0.0> : tensor<f32>
      %v36 = stablehlo.reduce(%v31 init: %v36_init) applies stablehlo.add across dimensions = [0] : (tensor<2xf32>, tensor<f32>) -> tensor<f32>
      %v37 = stablehlo.broadcast_in_dim %v36, dims = [] : (tensor<f32>) -> tensor<1x3xf32>
      %v38 = stablehlo.multiply %v35, %v37 : tensor<1x3xf32>
      %v39 = stablehlo.constant dense<0> : tensor<i64>
      %v40 = stablehlo.exponential %v31 : tensor<2xf32>
      %v41 = stablehlo.dynamic_update_slice %v32, %v38, %v30, %v39 : (tensor<4x3xf32>, tensor<1x3xf32>, tensor<i64>, tensor<i64>) -> tensor<4x3xf32>
      %v42 = stablehlo.constant dense<1> : tensor<i64>
      %v43 = stablehlo.add %v30, %v42 : tensor<i64>
      stablehlo.return %v43, %v40, %v41, %v45, %v33 : tensor<i64>, tensor<2xf32>, tensor<4x3xf32>, tensor<i64>, tensor<2x3xf32>
    }) : (tensor<i64>, tensor<2xf32>, tensor<4x3xf32>, tensor<i64>, tensor<2x3xf32>) -> (tensor<i64>, tensor<2xf32>, tensor<4x3xf32>, tensor<i64>, tensor<2x3xf32>)
    %v47 = stablehlo.transpose %v46#2, dims = [1, 0] : (tensor<4x3xf32>) -> tensor<3x4xf32>
    %v48 = stablehlo.dot_general %p0_x, %v47, contracting_dims = [1] x [0] {precision_config = [#stablehlo<precision HIGHEST>, #stablehlo<precision HIGHEST>]} : (tensor<2x3xf32>, tensor<3x4xf32>) -> tensor<2x4xf32>
    return %v4, %v6, %v21, %v12, %v14#0, %v14#1, %v15, %v48 : tensor<2xf32>, tensor<2x1xi64>, tensor<2x3xf32>, tensor<20xi64>, tensor<2x3xf32>, tensor<2x3xi64>, tensor<4x2xbf16>, tensor<2x4xf32>
  }
}
