#!/usr/bin/env bash
# Prints the PJRT C API's *_STRUCT_SIZE values for the structs stablegraph declares, computed by a C
# compiler from the official header (API 0.81, shipped in the xla-cpu-pjrt wheel). The unit test
# `runtime::ffi::tests::struct_sizes_match_the_header` holds this output.
# Usage: scripts/pjrt_struct_sizes.sh [path/to/pjrt_c_api.h]
set -euo pipefail
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
header=${1:-}
if [[ -z "$header" ]]; then
  python3 -m pip download --quiet --no-deps xla-cpu-pjrt==0.0.1 -d "$work"
  python3 -m zipfile -e "$work"/xla_cpu_pjrt-*.whl "$work/wheel"
  header="$work/wheel/xla_plugins/xla_cpu_pjrt/include/pjrt_c_api.h"
fi
names=(PJRT_Api_Version PJRT_NamedValue PJRT_Error_Message_Args PJRT_Error_GetCode_Args
  PJRT_Plugin_Initialize_Args PJRT_Plugin_Attributes_Args PJRT_Client_Create_Args PJRT_Program
  PJRT_Client_Compile_Args PJRT_Client_BufferFromHostBuffer_Args PJRT_DeviceDescription_Id_Args
  PJRT_Executable_OutputDimensions_Args PJRT_ExecuteOptions PJRT_LoadedExecutable_Execute_Args
  PJRT_Buffer_ElementType_Args PJRT_Buffer_ToHostBuffer_Args PJRT_Buffer_IsDeleted_Args
  PJRT_Executable_Serialize_Args PJRT_Executable_DeserializeAndLoad_Args PJRT_Api)
{
  echo "#include <stdio.h>"
  echo "#include \"$header\""
  echo "int main(void) {"
  for n in "${names[@]}"; do
    echo "  printf(\"(\\\"$n\\\", %zu),\\n\", (size_t)${n}_STRUCT_SIZE);"
  done
  echo "  return 0; }"
} > "$work/sizes.c"
cc -o "$work/sizes" "$work/sizes.c"
"$work/sizes"
