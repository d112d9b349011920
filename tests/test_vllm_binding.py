"""vLLM CPU's thread binding (grpo.rollout.vllm.cpu_binding): every core the sampler may use,
none kept back for vLLM's scheduler, unless the user chose a binding."""

from __future__ import annotations

from grpo.rollout.vllm import cpu_binding


def test_all_the_sampler_s_cores_none_reserved():
    assert cpu_binding({}, [1, 0]) == {
        "VLLM_CPU_OMP_THREADS_BIND": "0,1",
        "VLLM_CPU_NUM_OF_RESERVED_CPU": "0",
    }


def test_omp_num_threads_caps_the_cores():
    assert cpu_binding({"OMP_NUM_THREADS": "1"}, [2, 3])["VLLM_CPU_OMP_THREADS_BIND"] == "2"
    assert cpu_binding({"OMP_NUM_THREADS": "1,2"}, [2, 3])["VLLM_CPU_OMP_THREADS_BIND"] == "2"


def test_a_user_s_binding_is_left_alone():
    assert cpu_binding({"VLLM_CPU_OMP_THREADS_BIND": "nobind"}, [0, 1]) == {}
